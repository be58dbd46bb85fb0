"""OpenAI's error shape, and the mapping of every failure the server can meet onto it."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


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

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def install(app: FastAPI, say: Callable[[str], None]) -> None:
    """Answer ApiError and request validation errors as OpenAI-shaped JSON, with an access-log line."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        say(f"localspec: {request.method} {request.url.path} {e.status} {e.code or e.kind}")
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        err = e.errors()[0] if e.errors() else {}
        loc = [str(part) for part in err.get("loc", ()) if part != "body"]
        if err.get("type") == "json_invalid" or (not loc and err.get("type") != "missing"):
            error = ApiError(400, "the request body is not valid JSON", code="invalid_json")
        else:
            param = ".".join(loc) or None
            message = str(err.get("msg", "invalid request")).removeprefix("Value error, ")
            error = ApiError(400, f"{param}: {message}" if param else message, param=param)
        return await _api_error(request, error)
