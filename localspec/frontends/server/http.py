"""The HTTP/1.1 connection (uvicorn's h11 protocol) with the timeouts uvicorn lacks, so that nothing a client
does (or does not do) holds a connection for ever:

- a request's headers must arrive within `seconds` of the connection (or of the previous response), so
  sockets that send half a header, or nothing, are closed;
- a bounded send buffer, so a client that stops reading is felt at once, and a connection whose client reads
  nothing for `seconds` while a response waits to be sent is aborted (its generation is released);
- at most `max_connections` connections: a request on one more first closes the connections that wait for a
  request (the longest idle first), so sockets that send nothing never lock out a client that asks; where every
  other connection is busy, it is answered 503 in the API's error shape.

Bodies are timed by the guard, idle keep-alive connections by uvicorn, slow readers by the worker."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from localspec.frontends.server.errors import ApiError, send_error

# The kernel's send buffer of a connection. Left to itself Linux grows it to megabytes, which swallow a whole
# answer streamed to a client that reads nothing (2,000 tokens with 20 log-probabilities each), so the worker
# would only learn that the client stopped reading once the answer is done; 64 KiB holds a second of any stream.
SEND_BUFFER = 64 * 1024


def timed_protocol(seconds: float, max_connections: int | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol closing a connection whose next request's headers are late, aborting one whose
    client reads nothing, and refusing requests beyond `max_connections` connections."""

    class TimedH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _send_timer: asyncio.TimerHandle | None = None
        idle_since = 0.0  # when it began waiting for a request's headers

        @property
        def idle(self) -> bool:
            """Whether it waits for a request (none in flight)."""
            return self.cycle is None or self.cycle.response_complete

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None:  # a client that stops reading is felt after SEND_BUFFER bytes, not megabytes
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            if max_connections is not None:
                self.app = _capped(self.app, self.connections, max_connections)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._header_timer, self._send_timer):
                if timer is not None:
                    timer.cancel()
            super().connection_lost(exc)

        def pause_writing(self) -> None:  # the client's buffers are full: it must read within `seconds`
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(seconds, self.transport.abort)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self.idle_since = self.loop.time()
            self._header_timer = self.loop.call_later(seconds, self._expired)

        def _expired(self) -> None:
            if self.idle:  # still waiting for a request's headers
                self.transport.close()

    return TimedH11


def _capped(app: Any, connections: set[Any], limit: int) -> Any:
    """`app`, but a request on a connection beyond `limit` gets a 503 in the API's error shape, and the connection closes."""

    async def capped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            _close_idle(connections, len(connections) - limit)
        if scope["type"] != "http" or len(connections) <= limit:
            return await app(scope, receive, send)
        error = ApiError(
            503,
            f"the server has {limit} connections open, its most (see --max-connections); retry shortly",
            kind="server_error",
            code="too_many_connections",
            headers={"Retry-After": "2", "Connection": "close"},
        )
        await send_error(send, error, scope["path"])

    return capped


def _close_idle(connections: set[Any], excess: int) -> None:
    """Close up to `excess` connections that wait for a request, the longest idle first."""
    if excess <= 0:
        return
    idle = sorted((c for c in list(connections) if getattr(c, "idle", False)), key=lambda c: c.idle_since)
    for connection in idle[:excess]:
        connection.transport.close()
        connections.discard(connection)  # gone now: its connection_lost comes on the loop's next turn


def open_files_limit(connections: int) -> None:
    """Raise this process's open-file limit toward what `connections` sockets and the models need (within the
    hard limit: macOS starts processes at 256), so a crowd of clients meets a 503, not EMFILE."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
