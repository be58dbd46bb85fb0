"""The queue and the one thread that calls llama.cpp: generations run one at a time, in arrival order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from localspec.api import Generation
from localspec.core.stats import Piece
from localspec.frontends.server.errors import ApiError


class ClientGone(Exception):
    """The client went away: its generation is not started, or stops at the next round."""


async def watch_disconnect(receive: Callable[[], Any], left: asyncio.Event) -> None:
    """Set `left` when the client disconnects (run as a task once the request's body is read).

    A blocking receive, not a poll: uvicorn stops reading a connection whose request is complete, and a
    poll that cancels at once only starts it reading again, so it would see a disconnect one poll late."""
    while (await receive())["type"] != "http.disconnect":
        pass
    left.set()


class Worker:
    """Runs generations one at a time, in arrival order, on the one thread that calls llama.cpp."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-llama")
        self.lock = asyncio.Lock()  # FIFO: waiters are served in the order they came
        self.waiting = 0

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, *args)

    def admit(self) -> None:
        if self.waiting >= self.max_queue:
            raise ApiError(
                503,
                f"the server is busy ({self.waiting} requests waiting); retry shortly",
                kind="server_error",
                code="queue_full",
                headers={"Retry-After": "2"},
            )

    async def _turn(self, left: asyncio.Event) -> None:
        """Wait for the lock; a client that goes away meanwhile leaves the queue at once (ClientGone)."""
        turn = asyncio.ensure_future(self.lock.acquire())
        gone = asyncio.ensure_future(left.wait())
        try:
            await asyncio.wait((turn, gone), return_when=asyncio.FIRST_COMPLETED)
            if left.is_set():
                raise ClientGone
        except BaseException:  # gone, or this task cancelled: the turn passes to the next waiter
            if turn.done() and not turn.cancelled():
                self.lock.release()
            else:
                turn.cancel()
            raise
        finally:
            gone.cancel()

    async def stream(
        self, start: Callable[[], Generation], left: asyncio.Event
    ) -> AsyncGenerator[Piece | Generation, None]:
        """Yield the Generation first, then its pieces; `start` (run on the worker) returns the Generation.

        `left` says the client went away: checked when its turn comes (before the prefill) and between
        rounds, so nothing runs for a client that is no longer there (ClientGone)."""
        self.admit()
        self.waiting += 1
        try:
            await self._turn(left)
        finally:
            self.waiting -= 1
        pieces: Generator[Piece, None, None] | None = None
        try:
            run = await self.call(start)
            yield run
            pieces = iter(run)  # a generator: closing it ends the generation
            while (piece := await self.call(next, pieces, None)) is not None:
                yield piece
                if left.is_set():
                    raise ClientGone
        finally:  # no awaits here: it runs even when the client's task is being cancelled
            if pieces is not None:  # ends the generation (its stats, the caches) on the worker thread
                self.thread.submit(pieces.close)
            self.lock.release()
