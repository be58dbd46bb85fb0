"""The routes: health, models, chat and text completions, responses, behind the guard."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware

from localspec.api import LocalSpec
from localspec.frontends.server import errors
from localspec.frontends.server.errors import ApiError
from localspec.frontends.server.guard import LOOPBACK, Guard
from localspec.frontends.server.responses_api import ResponsesRequest, ResponsesShape
from localspec.frontends.server.schemas import ChatRequest, CompletionRequest
from localspec.frontends.server.service import Service
from localspec.frontends.server.shapes import Completions
from localspec.frontends.server.worker import Worker
from localspec.settings import default

SUPPORTED = [
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "response_format",
    "structured_outputs",
    "logprobs",
    "top_logprobs",
    "prediction",
    "suffix",
    "speculative.n_max",
]


def create_app(
    spec: LocalSpec,
    *,
    model_id: str,
    api_key: str | None = None,
    max_queue: int = default("max_queue"),
    log_prompts: bool = False,
    log: Callable[[str], None] | None = None,
    hosts: frozenset[str] | None = LOOPBACK,
    cors: frozenset[str] = frozenset(),
    max_body: int = default("max_body"),
    body_seconds: float = default("client_timeout"),
    stall_seconds: float = default("client_timeout"),
) -> FastAPI:
    """The ASGI app serving `spec` under the model id `model_id`.

    `hosts`: the Host names it answers to (None: any); `cors`: web origins allowed to call it from a browser;
    `max_body`: the largest request body in bytes, `body_seconds` the longest its arrival may take;
    `stall_seconds`: how long a client may read nothing before its generation is stopped. With `api_key`, every
    path but /health needs it."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    worker = Worker(max_queue, stall_seconds, say)
    service = Service(spec, model_id, worker, log_prompts, say)
    created = int(time.time())
    app = FastAPI(title="localspec", version="0.1.0", redoc_url=None)
    errors.install(app, say)
    if cors:
        app.add_middleware(CORSMiddleware, allow_origins=sorted(cors), allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(
        Guard,
        hosts=hosts,
        origins=cors,
        api_key=api_key,
        max_body=max_body,
        body_seconds=body_seconds,
        admit=worker.admit,
        say=say,
    )
    v1 = APIRouter(prefix="/v1")

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, Any]:
        worker = service.worker
        return {"status": "ok", "model": model_id, "waiting": worker.waiting, "busy": worker.lock.locked()}

    entry = {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "localspec",
        # what editors and routers read of a model: its context and the parameters it honours (Continue sends
        # `prediction` only to a model that lists it; OpenRouter-style clients and Aider read the context)
        "context_length": spec.n_ctx,
        "max_model_len": spec.n_ctx,
        "supported_parameters": SUPPORTED,
    }

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [entry]}

    @v1.get("/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model != model_id:
            raise ApiError(404, f"the model '{model}' does not exist here", param="model", code="model_not_found")
        return entry

    @v1.post("/chat/completions")
    async def chat_completions(request: Request, req: ChatRequest) -> Any:
        messages = [m.for_template() for m in req.messages]
        max_tokens = req.max_completion_tokens or req.max_tokens
        return await service.serve(request, req, Completions(True, model_id, req.include_usage()), messages, max_tokens)

    @v1.post("/completions")
    async def completions(request: Request, req: CompletionRequest) -> Any:
        max_tokens = req.max_tokens or 16
        return await service.serve(
            request, req, Completions(False, model_id, req.include_usage()), req.text(), max_tokens
        )

    @v1.post("/responses")
    async def responses(request: Request, req: ResponsesRequest) -> Any:
        shape = ResponsesShape(model_id, req)
        return await service.serve(request, req, shape, req.messages(), req.max_output_tokens)

    app.include_router(v1)
    app.state.worker = service.worker
    return app
