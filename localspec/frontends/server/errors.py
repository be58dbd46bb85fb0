"""OpenAI's error shape (Anthropic's on its paths), and the mapping of every failure the server can meet onto it."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException


class ApiError(Exception):
    """An error the client gets as OpenAI-shaped JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def body(self, anthropic: bool = False) -> dict[str, Any]:
        """OpenAI's error shape, or Anthropic's (its error types by status)."""
        if anthropic:
            kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self, anthropic: bool = False) -> JSONResponse:
        return AsciiJSON(self.body(anthropic), status_code=self.status, headers=self.headers)


ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_path(path: str) -> bool:
    """Whether a path is Anthropic's API (its errors in Anthropic's shape)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


class AsciiJSON(JSONResponse):
    """JSON escaped to ASCII: an error that quotes what a client sent answers whatever it sent."""

    def render(self, content: object) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


async def send_error(send: Any, error: ApiError, path: str = "") -> None:
    """Answer with `error` at the ASGI level (before or beside the app: the guard, the connection cap)."""
    body = json.dumps(error.body(anthropic_path(path))).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyRefused(HTTPException):
    """Raised while the body is read (too large, too slow): an HTTPException, so that FastAPI's body parsing lets
    it through to the handler, which answers with its ApiError."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.status, error.message)
        self.error = error


_BRANCHES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _loc(err: Any) -> list[str]:
    """Where a validation error is, as a client names it: pydantic's labels of a union's branches left out."""
    parts = [str(part) for part in err.get("loc", ()) if part != "body"]
    return [p for p in parts if "[" not in p and p not in _BRANCHES]


def install(app: FastAPI, say: Callable[[str], None]) -> None:
    """Answer ApiError and request validation errors as OpenAI-shaped JSON, with an access-log line."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        said = e.message if len(e.message) <= 200 else e.message[:199] + "…"  # why, for whoever reads the log
        say(f"localspec: {request.method} {request.url.path} {e.status} {e.code or e.kind}: {said}")
        return e.response(anthropic_path(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        loc = max((_loc(err) for err in errors), key=len, default=[])  # the branch of a union that got furthest
        deepest = [err for err in errors if _loc(err) == loc] or [{}]
        err = deepest[0]
        if err.get("type") == "json_invalid" or (not loc and err.get("type") not in ("missing", "value_error")):
            error = ApiError(400, "the request body is not valid JSON", code="invalid_json")
        else:
            param = ".".join(loc) or None
            said = [str(d.get("msg", "invalid request")).removeprefix("Value error, ") for d in deepest]
            message = ", or ".join(dict.fromkeys(said))  # what each branch wanted there
            error = ApiError(400, f"{param}: {message}" if param else message, param=param)
        return await _api_error(request, error)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        """Starlette's own: an unknown path (404), a wrong method (405), a body it cannot read (400); the guard's
        refusals of a body (BodyRefused)."""
        if isinstance(e, BodyRefused):
            return await _api_error(request, e.error)
        message = {
            404: f"no such endpoint: {request.method} {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(e.status_code, "the request body could not be read (it must be UTF-8 JSON)")
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "invalid_body")
        kind = "invalid_request_error"
        error = ApiError(e.status_code, message, code=code, kind=kind, headers=getattr(e, "headers", None))
        return await _api_error(request, error)

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> JSONResponse:
        """A bug: the client gets a 500 in the API's error shape, never the traceback (that goes to the log)."""
        say(f"localspec: {request.method} {request.url.path} 500 internal error\n{traceback.format_exc().rstrip()}")
        error = ApiError(500, "internal server error (the server's log has the details)", kind="server_error")
        return error.response(anthropic_path(request.url.path))
