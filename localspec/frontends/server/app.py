"""The routes, and the service behind them: one loaded pair serving chat and text completions."""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from localspec.api import Generation, LocalSpec
from localspec.core.stats import Piece, prediction_usage
from localspec.decoding.loader import RunConfig
from localspec.errors import LocalspecError
from localspec.frontends.server import errors
from localspec.frontends.server.errors import ApiError
from localspec.frontends.server.responses import Served, Shape, finish, sse, usage
from localspec.frontends.server.schemas import ChatRequest, CompletionRequest, Prediction, RequestBase
from localspec.frontends.server.worker import Worker
from localspec.llama.model import ContextFull
from localspec.models.catalog import catalog, default_pair

Stream = AsyncGenerator[Piece | Generation, None]


class Service:
    """What the routes call: requests checked, queued on the worker, answered whole or streamed, logged."""

    def __init__(
        self, spec: LocalSpec, model_id: str, max_queue: int, log_prompts: bool, say: Callable[[str], None]
    ) -> None:
        self.spec, self.model_id, self.log_prompts, self.say = spec, model_id, log_prompts, say
        self.worker = Worker(max_queue)

    def _begin(
        self, prompt: Any, req: RequestBase, max_tokens: int | None, prediction: Prediction | None, raw: bool
    ) -> Callable[[], Generation]:
        """What the worker runs first: the generation set up (tokenized, checked), not yet decoding."""
        spec, defaults = self.spec, self.spec.config.sampler

        def begin() -> Generation:
            try:
                return spec.generate(
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

        return begin

    async def serve(
        self,
        request: Request,
        req: RequestBase,
        shape: Shape,
        prompt: Any,
        max_tokens: int | None,
        prediction: Prediction | None,
        raw: bool,
    ) -> Any:
        """Answer one request: a whole JSON response, or a stream of server-sent events."""
        t0 = time.perf_counter()
        if req.model != self.model_id:
            raise ApiError(
                404,
                f"the model '{req.model}' does not exist here (this server has '{self.model_id}')",
                param="model",
                code="model_not_found",
            )
        req.refuse_unsupported()
        stream = self.worker.stream(self._begin(prompt, req, max_tokens, prediction, raw))
        run = await stream.__anext__()  # waits its turn; errors before decoding are plain 4xx responses
        assert isinstance(run, Generation)
        rid, now = f"{'chatcmpl' if shape.chat else 'cmpl'}-{secrets.token_hex(12)}", int(time.time())
        first: list[float] = []

        def done() -> Served:
            predicted = None if run.prediction is None else prediction_usage(run.prediction, run.tokens)
            served = Served(run.text, run.stats, run.seed, predicted, (first or [time.perf_counter()])[0] - t0)
            st = served.stats
            self.say(
                f"localspec: {request.method} {request.url.path} 200 {st.prompt_tokens}+{st.completion_tokens} "
                f"tokens, first token {served.first_token:.2f} s, {st.tokens_per_second or 0:.1f} tok/s, "
                f"{st.accepted}/{st.drafted} drafts accepted, {st.finish_reason}"
                + (f", prompt {prompt!r}" if self.log_prompts else "")
            )
            return served

        if not req.stream:
            try:
                async for _ in stream:
                    first = first or [time.perf_counter()]
            finally:
                await stream.aclose()
            return JSONResponse(shape.final(rid, now, done()))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = self._events(request, stream, run, shape, rid, now, first, done, include_usage)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    async def _events(
        self,
        request: Request,
        stream: Stream,
        run: Generation,
        shape: Shape,
        rid: str,
        now: int,
        first: list[float],
        done: Callable[[], Served],
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        served: Served | None = None
        try:
            if shape.chat:
                yield sse(shape.chunk(rid, now, None, None, role=True))
            async for piece in stream:
                assert isinstance(piece, Piece)
                first.append(time.perf_counter())
                yield sse(shape.chunk(rid, now, piece.text, None))
            yield sse(shape.chunk(rid, now, None, finish(run.stats)))
            served = done()
            if include_usage:
                chunk = {"id": rid, "object": shape.chunk_object, "created": now, "model": shape.model}
                yield sse({**chunk, "choices": [], "usage": usage(served)})
            yield sse("[DONE]")
        finally:
            with anyio.CancelScope(shield=True):  # a client that went away: stop the generation now
                await stream.aclose()
            if served is None:
                self.say(
                    f"localspec: {request.method} {request.url.path} 499 the client went away after "
                    f"{len(run.tokens)} tokens"
                )


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
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    service = Service(spec, model_id, max_queue, log_prompts, say)
    created = int(time.time())

    async def authorized(request: Request) -> None:
        if api_key and request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise ApiError(401, "incorrect API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")

    app = FastAPI(title="localspec", version="0.1.0", redoc_url=None)
    errors.install(app, say)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorized)])

    @app.get("/health")
    async def health() -> dict[str, Any]:
        worker = service.worker
        return {"status": "ok", "model": model_id, "waiting": worker.waiting, "busy": worker.lock.locked()}

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        entry = {"id": model_id, "object": "model", "created": created, "owned_by": "localspec"}
        return {"object": "list", "data": [entry]}

    @v1.post("/chat/completions")
    async def chat_completions(request: Request, req: ChatRequest) -> Any:
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
        max_tokens = req.max_completion_tokens or req.max_tokens
        return await service.serve(request, req, Shape(True, model_id), messages, max_tokens, req.prediction, False)

    @v1.post("/completions")
    async def completions(request: Request, req: CompletionRequest) -> Any:
        max_tokens = req.max_tokens or 16
        return await service.serve(request, req, Shape(False, model_id), req.text(), max_tokens, req.prediction, True)

    app.include_router(v1)
    app.state.worker = service.worker
    return app


def model_name(config: RunConfig) -> str:
    """The default model id: the target's catalog name, or its file name without .gguf."""
    target = config.target or default_pair()[0].name
    return target if target in catalog() else Path(target).name.removesuffix(".gguf")
