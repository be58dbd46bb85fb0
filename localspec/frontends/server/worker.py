"""The queue and the one thread that calls llama.cpp: generations run one at a time, in arrival order.

A generation is decoupled from its sending: it runs into a bounded buffer that the response drains, so a
client that reads slowly or not at all holds the worker at most `stall_seconds` in all beyond the generation's
own time (then its generation stops and the next request starts); one that goes away stops its generation at
the next round, or leaves the queue at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from localspec.api import Generation, Piece
from localspec.frontends.server.errors import ApiError

BUFFER = 64  # pieces a generation may run ahead of its client


class ClientGone(Exception):
    """The client went away (or stopped reading): its generation is not started, or stops at the next round."""


class Stalled(ClientGone):
    """The client kept its answer waiting too long (it reads too slowly, or not at all): it is still there, and is
    told so in the stream, not left with an answer that looks whole."""


class Leave(asyncio.Event):
    """Set when a request's client went away, or stalled its answer (`stalled`)."""

    stalled = False

    def gone(self) -> ClientGone:
        return Stalled() if self.stalled else ClientGone()


@dataclass
class Sent:
    """A piece of the answer and how many of the generation's log-probabilities belong with the text so far."""

    piece: Piece
    logprobs: int


async def watch_disconnect(receive: Callable[[], Any], left: Leave) -> None:
    """Set `left` when the client disconnects (run as a task once the request's body is read).

    A blocking receive, not a poll: uvicorn stops reading a connection whose request is complete, and a
    poll that cancels at once only starts it reading again, so it would see a disconnect one poll late."""
    while (await receive())["type"] != "http.disconnect":
        pass
    left.set()


class Ticket:
    """A request's place among those admitted and not yet running (reading, checking, queued)."""

    def __init__(self, worker: Worker) -> None:
        self.worker, self.held = worker, True
        worker.waiting += 1

    def release(self) -> None:
        if self.held:
            self.held = False
            self.worker.waiting -= 1


class Worker:
    """Runs generations one at a time, in arrival order, on the one thread that calls llama.cpp."""

    def __init__(self, max_queue: int, stall_seconds: float, say: Callable[[str], None] = print) -> None:
        self.max_queue, self.stall_seconds, self.say = max_queue, stall_seconds, say
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-llama")
        self.lock = asyncio.Lock()  # FIFO: waiters are served in the order they came
        self.waiting = 0  # admitted requests not running yet

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, *args)

    def admit(self) -> Ticket:
        """A place for one more request before its body is read; 503 when `max_queue` already wait."""
        if self.waiting >= self.max_queue:
            raise ApiError(
                503,
                f"the server is busy ({self.waiting} requests waiting); retry shortly",
                kind="server_error",
                code="queue_full",
                headers={"Retry-After": "2"},
            )
        return Ticket(self)

    async def _turn(self, left: Leave) -> None:
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
        self, start: Callable[[], Generation], left: Leave, ticket: Ticket
    ) -> AsyncGenerator[Generation | Sent, None]:
        """Yield the Generation first, then its pieces; `start` (run on the worker) returns the Generation.

        The request's `ticket` is given up when its turn comes. `left` says the client went away: checked when
        its turn comes (before the prefill) and at every piece, so nothing runs for a client no longer there."""
        try:
            await self._turn(left)
        finally:
            ticket.release()
        buffer: asyncio.Queue[Generation | Sent | BaseException | None] = asyncio.Queue(BUFFER)
        producer = asyncio.create_task(self._produce(start, left, buffer))
        try:
            while (item := await buffer.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
                if left.is_set():
                    raise left.gone()
            if left.is_set():  # the generation stopped for a client that went away, or stalled it
                raise left.gone()
        finally:
            left.set()  # the producer stops at its next piece (no awaits here: this may run while cancelled)
            producer.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _produce(
        self,
        start: Callable[[], Generation],
        left: Leave,
        buffer: asyncio.Queue[Generation | Sent | BaseException | None],
    ) -> None:
        """Run the generation on the worker thread into `buffer`, holding the lock; give up when the client
        went away, or has kept it waiting `stall_seconds` in all (it reads too slowly, or not at all). The
        buffer ends with None, after an exception where one stopped the generation (a 4xx before decoding, a
        failure after)."""
        pieces: Generator[Piece, None, None] | None = None
        end: BaseException | None = None
        budget = self.stall_seconds  # what the client may keep the generation waiting, in all
        try:
            run = await self.call(start)
            buffer.put_nowait(run)
            pieces = iter(run)  # a generator: closing it ends the generation
            while not left.is_set() and (piece := await self.call(next, pieces, None)) is not None:
                waited = await self._put(buffer, Sent(piece, len(run.logprobs or ())), left, budget)
                if waited is None:
                    break
                budget -= waited
        except Exception as e:
            end = e
        finally:  # ends the generation (its stats, the caches) on the worker thread, then the next one runs
            if pieces is not None:
                self.thread.submit(pieces.close)
            self.lock.release()
        if end is not None:
            await self._put(buffer, end, left, self.stall_seconds)
        await self._put(buffer, None, left, self.stall_seconds)

    async def _put(self, buffer: asyncio.Queue[Any], item: Any, left: Leave, budget: float) -> float | None:
        """Put `item` in the buffer unless the client goes away, or leaves it full longer than `budget` seconds
        (None); the seconds it waited."""
        if buffer.full():
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            put, gone = asyncio.ensure_future(buffer.put(item)), asyncio.ensure_future(left.wait())
            await asyncio.wait((put, gone), timeout=max(budget, 0.0), return_when=asyncio.FIRST_COMPLETED)
            put.cancel()
            gone.cancel()
            if not put.done() or put.cancelled():
                if not left.is_set():
                    self.say(
                        f"localspec: a client kept its answer waiting {self.stall_seconds:g} s in all (it reads "
                        "too slowly, or not at all): its generation stopped"
                    )
                    left.stalled = True
                    left.set()
                return None
            return loop.time() - t0
        buffer.put_nowait(item)
        return 0.0
