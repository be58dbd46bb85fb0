"""`localspec serve`: an OpenAI-compatible HTTP API over one loaded pair, with Predicted Outputs.

FastAPI (on Starlette, served by uvicorn) because its request models validate every field with
types and ranges, so each bad field becomes an OpenAI-shaped 400 naming it, and it gives
server-sent-event streaming and an OpenAPI schema (/docs) for free.

One pair serves one generation at a time: requests wait in arrival order in a bounded queue (503
with Retry-After beyond it). Every call into llama.cpp runs on one worker thread, so a client that
disconnects mid-stream stops its generation at the next round and the next request starts at once.
A request that shares a prefix with the cached context (the next turn of a chat, the same system
prompt) decodes only what is new: the target's cache keeps the longest common prefix.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from localspec.api import Generation, LocalSpec
from localspec.core.stats import Piece, Stats, prediction_usage
from localspec.decoding.loader import RunConfig
from localspec.errors import LocalspecError
from localspec.llama.model import ContextFull
from localspec.models.catalog import catalog, default_pair
from localspec.settings import SETTINGS


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


# ---- requests -------------------------------------------------------------------------------
class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class Prediction(BaseModel):
    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """Fields that chat and text completions share."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: Annotated[int | None, Field(ge=1)] = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("temperature", "top_p", "top_k", "min_p", "seed")
    @classmethod
    def _in_range(cls, v: Any, info: ValidationInfo) -> Any:
        """The ranges of the settings table (the same as the command line's)."""
        return v if v is None else SETTINGS[str(info.field_name)].check(v)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def refuse_unsupported(self) -> None:
        """Fields that would change the answer in ways localspec does not implement: a 400 naming each."""
        unsupported = {
            "n": self.n not in (None, 1),
            "logprobs": bool(self.logprobs),
            "top_logprobs": bool(self.top_logprobs),
            "frequency_penalty": bool(self.frequency_penalty),
            "presence_penalty": bool(self.presence_penalty),
            "logit_bias": bool(self.logit_bias),
            "tools": bool(self.tools),
            "functions": bool(self.functions),
            "response_format": bool(self.response_format) and (self.response_format or {}).get("type") != "text",
        }
        for field, present in unsupported.items():
            if present:
                raise ApiError(
                    400,
                    f"localspec does not support '{field}' (it would change the answer)",
                    param=field,
                    code="unsupported_parameter",
                )

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int | None, Field(ge=1)] = None
    prediction: Prediction | None = None


class CompletionRequest(Sampling):
    prompt: str | list[str]
    prediction: Prediction | None = None  # an extension: the same draft source for raw completions

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt per request")
        return v

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# ---- the worker -------------------------------------------------------------------------------
@dataclass
class Served:
    """What a finished (or cut) generation reports."""

    text: str
    stats: Stats
    seed: int
    prediction: tuple[int, int] | None  # (accepted, rejected) prediction tokens, OpenAI's way
    first_token: float  # seconds from the request's arrival to its first text


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

    async def stream(self, start: Callable[[], Generation]) -> AsyncGenerator[Piece | Generation, None]:
        """Yield the Generation first, then its pieces; `start` (run on the worker) returns the Generation."""
        self.admit()
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        pieces: Generator[Piece, None, None] | None = None
        try:
            run = await self.call(start)
            yield run
            pieces = iter(run)  # a generator: closing it ends the generation
            while (piece := await self.call(next, pieces, None)) is not None:
                yield piece
        finally:  # no awaits here: it runs even when the client's task is being cancelled
            if pieces is not None:  # ends the generation (its stats, the caches) on the worker thread
                self.thread.submit(pieces.close)
            self.lock.release()


# ---- the app ----------------------------------------------------------------------------------
def _usage(served: Served) -> dict[str, Any]:
    st = served.stats
    accepted, rejected = served.prediction or (0, 0)
    return {
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.completion_tokens,
        "total_tokens": st.prompt_tokens + st.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": st.prompt_tokens - st.prefill_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
            "reasoning_tokens": 0,
        },
        "localspec": {
            "seed": served.seed,
            "drafted": st.drafted,
            "accepted": st.accepted,
            "target_passes": st.target_passes,
            "time_to_first_token": served.first_token,
            "prefill_seconds": st.prefill_seconds,
            "tokens_per_second": st.tokens_per_second,
            "drafted_by": st.drafted_by,
            "accepted_by": st.accepted_by,
        },
    }


def _sse(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


@dataclass(frozen=True)
class Shape:
    """How one endpoint's responses look: chat completions or text completions."""

    chat: bool
    model: str

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, rid: str, now: int, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": self.chunk_object, "created": now, "model": self.model, "choices": [choice]}

    def final(self, rid: str, now: int, served: Served) -> dict[str, Any]:
        finish = _finish(served.stats)
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": served.text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": served.text, "logprobs": None, "finish_reason": finish}
        return {
            "id": rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": now,
            "model": self.model,
            "choices": [choice],
            "usage": _usage(served),
        }


def create_app(
    spec: LocalSpec,
    *,
    model_id: str,
    api_key: str | None = None,
    max_queue: int = 16,
    log_prompts: bool = False,
    log: Callable[[str], None] | None = None,
) -> FastAPI:
    """The ASGI app serving `spec` under the model id `model_id`."""
    worker = Worker(max_queue)
    defaults = spec.config.sampler
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    created = int(time.time())

    async def authorized(request: Request) -> None:
        if api_key and request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise ApiError(401, "incorrect API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")

    app = FastAPI(title="localspec", version="0.1.0", redoc_url=None)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorized)])

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

    def start(
        prompt: Any, req: Sampling, max_tokens: int | None, prediction: Prediction | None, raw: bool
    ) -> Callable[[], Generation]:
        """What the worker runs first: the generation set up (tokenized, checked), not yet decoding."""

        def begin() -> Generation:
            try:
                run = spec.generate(
                    prompt,
                    raw=raw,
                    max_tokens=max_tokens or spec.engine.target.n_ctx,
                    stop=req.stops(),
                    temperature=defaults.temperature if req.temperature is None else req.temperature,
                    top_k=defaults.top_k if req.top_k is None else req.top_k,
                    top_p=defaults.top_p if req.top_p is None else req.top_p,
                    min_p=defaults.min_p if req.min_p is None else req.min_p,
                    seed=req.seed,
                    prediction=prediction.text() if prediction else None,
                )
            except ContextFull as e:
                raise ApiError(400, str(e), param="messages", code="context_length_exceeded") from None
            except LocalspecError as e:  # an empty prompt
                raise ApiError(400, str(e), param="prompt") from None
            return run

        return begin

    async def serve(
        request: Request,
        req: Sampling,
        shape: Shape,
        prompt: Any,
        max_tokens: int | None,
        prediction: Prediction | None,
        raw: bool,
    ) -> Any:
        t0 = time.perf_counter()
        if req.model != model_id:
            raise ApiError(
                404,
                f"the model '{req.model}' does not exist here (this server has '{model_id}')",
                param="model",
                code="model_not_found",
            )
        req.refuse_unsupported()
        stream = worker.stream(start(prompt, req, max_tokens, prediction, raw))
        run = await stream.__anext__()  # waits its turn; errors before decoding are plain 4xx responses
        assert isinstance(run, Generation)
        rid, now = f"{'chatcmpl' if shape.chat else 'cmpl'}-{secrets.token_hex(12)}", int(time.time())
        first: list[float] = []

        def done() -> Served:
            predicted = None if run.prediction is None else prediction_usage(run.prediction, run.tokens)
            served = Served(run.text, run.stats, run.seed, predicted, (first or [time.perf_counter()])[0] - t0)
            st = served.stats
            line = (
                f"localspec: {request.method} {request.url.path} 200 {st.prompt_tokens}+{st.completion_tokens} "
                f"tokens, first token {served.first_token:.2f} s, {st.tokens_per_second or 0:.1f} tok/s, "
                f"{st.accepted}/{st.drafted} drafts accepted, {st.finish_reason}"
            )
            say(line + (f", prompt {prompt!r}" if log_prompts else ""))
            return served

        if not req.stream:
            try:
                async for _ in stream:
                    first = first or [time.perf_counter()]
            finally:
                await stream.aclose()
            return JSONResponse(shape.final(rid, now, done()))

        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        served_once: list[Served] = []

        async def events() -> AsyncIterator[bytes]:
            try:
                if shape.chat:
                    yield _sse(shape.chunk(rid, now, None, None, role=True))
                async for piece in stream:
                    assert isinstance(piece, Piece)
                    first.append(time.perf_counter())
                    yield _sse(shape.chunk(rid, now, piece.text, None))
                yield _sse(shape.chunk(rid, now, None, _finish(run.stats)))
                served = done()
                served_once.append(served)
                if include_usage:
                    yield _sse(
                        {
                            "id": rid,
                            "object": shape.chunk_object,
                            "created": now,
                            "model": model_id,
                            "choices": [],
                            "usage": _usage(served),
                        }
                    )
                yield _sse("[DONE]")
            finally:
                with anyio.CancelScope(shield=True):  # a client that went away: stop the generation now
                    await stream.aclose()
                if not served_once:
                    say(
                        f"localspec: {request.method} {request.url.path} 499 the client went away after "
                        f"{len(run.tokens)} tokens"
                    )

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_id, "waiting": worker.waiting, "busy": worker.lock.locked()}

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model_id, "object": "model", "created": created, "owned_by": "localspec"}],
        }

    @v1.post("/chat/completions")
    async def chat_completions(request: Request, req: ChatRequest) -> Any:
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
        return await serve(
            request,
            req,
            Shape(True, model_id),
            messages,
            req.max_completion_tokens or req.max_tokens,
            req.prediction,
            False,
        )

    @v1.post("/completions")
    async def completions(request: Request, req: CompletionRequest) -> Any:
        return await serve(request, req, Shape(False, model_id), req.text(), req.max_tokens or 16, req.prediction, True)

    app.include_router(v1)
    app.state.worker = worker
    return app


def model_name(config: RunConfig) -> str:
    """The default model id: the target's catalog name, or its file name without .gguf."""
    target = config.target or default_pair()[0].name
    return target if target in catalog() else Path(target).name.removesuffix(".gguf")


def _finish(st: Stats) -> str:
    return "length" if st.finish_reason == "length" else "stop"
