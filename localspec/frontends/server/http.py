"""The HTTP/1.1 connection (uvicorn's h11 protocol) with the one timeout uvicorn lacks: a request's headers
must arrive within `header_seconds` of the connection (or of the previous response), so sockets that send
half a header, or nothing, do not stay open forever; and a bounded send buffer, so a client that stops
reading is felt at once. Bodies are timed by the guard, idle keep-alive
connections by uvicorn, clients that stop reading by the worker."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

# The kernel's send buffer of a connection. Left to itself Linux grows it to megabytes, which swallow a whole
# answer streamed to a client that reads nothing (2,000 tokens with 20 log-probabilities each), so the worker
# would only learn that the client stopped reading once the answer is done; 64 KiB holds a second of any stream.
SEND_BUFFER = 64 * 1024


def timed_protocol(header_seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol closing a connection whose next request's headers are late."""

    class TimedH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None:  # a client that stops reading is felt after SEND_BUFFER bytes, not megabytes
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(header_seconds, self._expired)

        def _expired(self) -> None:
            if self.cycle is None or self.cycle.response_complete:  # still waiting for a request's headers
                self.transport.close()

    return TimedH11


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
