"""What stands before every route: the Host allow-list, the Origin check, the API key, body limits, admission.

A keyless server on 127.0.0.1 is still reachable from a web page in the user's browser through DNS
rebinding (the page's name resolves to 127.0.0.1, and the browser sends the page's name as Host), so
only loopback names (and those the user allows) are served, and a browser's cross-site Origin is
refused unless named with --cors. Ollama and Jupyter check both for the same reason.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from localspec.frontends.server.errors import ApiError, BodyRefused, send_error
from localspec.frontends.server.worker import Ticket

LOOPBACK = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
OPEN_PATHS = frozenset({"/", "/health", "/api/hello"})  # answered without the key
# admitted only while the queue has room, before their bodies are read
GENERATING = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})
# A body holding more JSON values than this (objects, arrays and their members, as a parse makes Python objects of
# them) is refused as it arrives: parsing and checking a value costs the event loop a microsecond or two, and every
# parse holds the GIL, so half a million tiny items would stall every client for seconds. A request any context here
# reads holds a few thousand (Claude Code's 12k tokens: about 4,000); a prompt field may hold at most MAX_MESSAGES.
MAX_VALUES = 2**16
PROMPT_FIELDS = {"/v1/completions": "prompt", "/v1/responses": "input"}  # where a body's bulk is ("messages" else)
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # an escape in a JSON string (a quote escaped among them)


class ValueCount:
    """The JSON values a body holds, counted piece by piece as it arrives, at C speed: the commas, braces and
    brackets outside strings (an upper bound where the JSON is broken: its parse refuses it then)."""

    def __init__(self) -> None:
        self.values = 0
        self._in_string = False  # where the last piece ended
        self._carry = b""  # a backslash that ended the last piece: it escapes this one's first byte

    def feed(self, piece: bytes) -> int:
        """The count with `piece`, the body's next bytes."""
        data = _ESCAPE.sub(b"", self._carry + piece)  # no escape left: every quote opens or closes a string
        self._carry = b""
        if data.endswith(b"\\"):
            self._carry, data = b"\\", data[:-1]
        parts = data.split(b'"')  # outside and inside strings in turn
        outside = b"".join(parts[1 if self._in_string else 0 :: 2])
        self._in_string ^= len(parts) % 2 == 0
        self.values += outside.count(b",") + outside.count(b"{") + outside.count(b"[")
        return self.values


def host_name(host: str) -> str:
    """The name in a Host header or URL authority, without the port ('[::1]:8080' -> '[::1]')."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.split("]")[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_hosts(
    host: str, allow_host: Sequence[str], api_key: str | None
) -> tuple[frozenset[str] | None, str | None]:
    """The Host names served (None: any) for a server bound to `host`, and a warning where it needs one.

    As Ollama does: bound to loopback, only loopback names (and those allowed) are served, against DNS
    rebinding; bound beyond it, any name unless --allow-host lists them (the key is the protection there)."""
    loopback = host_name(host) in LOOPBACK
    warning = None
    if not loopback and not api_key:
        warning = (
            f"serving on {host} without --api-key: anyone who can reach this machine can use the model. "
            "Set --api-key (or LOCALSPEC_API_KEY), or bind to 127.0.0.1."
        )
    named = {host_name(h) for h in allow_host}
    hosts = frozenset(LOOPBACK | named | {host_name(host)}) if (loopback or named) and "*" not in named else None
    return hosts, warning


def origin_host(origin: str) -> str | None:
    """The host name of an Origin header (None where it is no URL: a web page the server does not know)."""
    try:
        return host_name(urlsplit(origin).netloc)
    except ValueError:
        return None


def key_matches(authorization: str, api_key: str) -> bool:
    """An `Authorization: Bearer KEY` header (the scheme in any case), compared in constant time: the header's bytes
    (read as latin-1, HTTP's own) against the key's UTF-8, as a client sends a key that is not ASCII."""
    scheme, _, token = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode("latin-1"), api_key.encode())


class Guard:
    """ASGI middleware: refuses, in OpenAI's error shape, what must not reach a route."""

    def __init__(
        self,
        app: Any,
        *,
        hosts: frozenset[str] | None,
        origins: frozenset[str],
        api_key: str | None,
        max_body: int,
        body_seconds: float,
        admit: Callable[[], Ticket],
        say: Callable[[str], None],
    ) -> None:
        self.app, self.hosts, self.origins, self.api_key, self.say = app, hosts, origins, api_key, say
        self.max_body, self.body_seconds, self.admit = max_body, body_seconds, admit

    def _refusal(self, scope: dict[str, Any], headers: dict[str, str]) -> ApiError | None:
        if self.hosts is not None and host_name(headers.get("host", "")) not in self.hosts:
            return ApiError(403, "this server does not answer to that Host name (see --allow-host)", code="bad_host")
        origin = headers.get("origin")
        if origin and origin not in self.origins and (self.hosts is None or origin_host(origin) not in self.hosts):
            return ApiError(
                403, f"requests from the web page at {origin} are not allowed (see --cors)", code="bad_origin"
            )
        needs_key = self.api_key and scope["path"] not in OPEN_PATHS and scope["method"] != "OPTIONS"
        if needs_key and not (
            key_matches(headers.get("authorization", ""), self.api_key or "")
            or key_matches(f"Bearer {headers.get('x-api-key', '')}", self.api_key or "")  # Anthropic's header
        ):
            return ApiError(
                401, "incorrect API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'", code="invalid_api_key"
            )
        if scope["method"] == "POST":
            kind = headers.get("content-type", "application/json").split(";")[0].strip().lower()
            if kind != "application/json" and not kind.endswith("+json"):
                return ApiError(
                    415,
                    f"the body must be JSON (Content-Type: application/json), not {kind}",
                    code="unsupported_media_type",
                )
            if int(headers.get("content-length") or 0) > self.max_body:
                return self._too_large()
        return None

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"the request body is larger than {self.max_body} bytes (see --max-body)",
            param=None,
            code="body_too_large",
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        ticket = None
        try:
            if error := self._refusal(scope, headers):
                raise error
            if scope["method"] == "POST" and scope["path"] in GENERATING:  # a place in the queue before the body
                ticket = scope.setdefault("state", {})["ticket"] = self.admit()
        except ApiError as error:
            self.say(f"localspec: {scope['method']} {scope['path']} {error.status} {error.code}")
            return await send_error(send, error, scope["path"])
        seen, whole, started = 0, False, False
        deadline = asyncio.get_running_loop().time() + self.body_seconds  # for the whole body, not each piece
        count = ValueCount()
        field = PROMPT_FIELDS.get(scope["path"], "messages")

        async def counted() -> dict[str, Any]:
            nonlocal seen, whole
            if whole:  # the body is read: what comes now is the disconnect, whenever it comes
                return dict(await receive())
            try:
                left = max(deadline - asyncio.get_running_loop().time(), 0.0)
                message = dict(await asyncio.wait_for(receive(), left))
            except (TimeoutError, asyncio.TimeoutError):  # one class from Python 3.11 on, two before
                raise BodyRefused(self._too_slow()) from None
            seen += len(message.get("body", b""))
            whole = message["type"] != "http.request" or not message.get("more_body", False)
            if seen > self.max_body:
                raise BodyRefused(self._too_large())
            if count.feed(message.get("body", b"")) > MAX_VALUES:
                raise BodyRefused(
                    ApiError(
                        400,
                        f"the body holds more than {MAX_VALUES} JSON values (objects, arrays and their members): more "
                        "than any request localspec can answer",
                        param=field,
                        code="too_many",
                    )
                )
            return message

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyRefused as e:  # refused outside a route's body parsing
            if not started:
                self.say(f"localspec: {scope['method']} {scope['path']} {e.error.status} {e.error.code}")
                await send_error(send, e.error, scope["path"])
        finally:
            if ticket is not None:
                ticket.release()

    def _too_slow(self) -> ApiError:
        return ApiError(408, f"the request body did not arrive within {self.body_seconds:g} s", code="body_timeout")
