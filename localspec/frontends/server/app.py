"""The routes: health, models, chat and text completions, responses, Anthropic's messages, behind the guard."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from localspec import __version__
from localspec.api import LocalSpec
from localspec.frontends.server import chat, completions, errors, messages, responses
from localspec.frontends.server.errors import ApiError
from localspec.frontends.server.guard import Guard, allowed_hosts
from localspec.frontends.server.service import Service
from localspec.frontends.server.settings import ServerSettings
from localspec.frontends.server.worker import Worker

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
    spec: LocalSpec, settings: ServerSettings, *, model_id: str, log: Callable[[str], None] | None = None
) -> FastAPI:
    """The ASGI app serving `spec` under the model id `model_id`, as `settings` say (its Host names, key, origins,
    queue, body and client limits); `log` takes the access log's lines (default: stderr)."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    worker = Worker(settings.max_queue, settings.client_timeout, say)
    service = Service(spec, model_id, worker, settings.log_prompts, say)
    app = FastAPI(title="localspec", version=__version__, redoc_url=None)
    errors.install(app, say)
    _guard(app, settings, worker, say)
    v1 = APIRouter(prefix="/v1")
    _describe(app, v1, service)
    for endpoint in (chat, completions, responses, messages):
        endpoint.add_route(v1, service)
    app.include_router(v1)
    app.state.worker = worker
    return app


def _guard(app: FastAPI, settings: ServerSettings, worker: Worker, say: Callable[[str], None]) -> None:
    """The middleware every request passes: CORS for the origins allowed, then the guard (hosts, key, bodies,
    admission to the queue)."""
    cors = frozenset(settings.cors)
    if cors:
        app.add_middleware(CORSMiddleware, allow_origins=sorted(cors), allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(
        Guard,
        hosts=allowed_hosts(settings.host, settings.allow_host, settings.api_key)[0],
        origins=cors,
        api_key=settings.api_key,
        max_body=settings.max_body,
        body_seconds=settings.client_timeout,
        admit=worker.admit,
        say=say,
    )


def _describe(app: FastAPI, v1: APIRouter, service: Service) -> None:
    """GET /health and the models list: what the server serves and how busy it is."""
    model_id, worker = service.model_id, service.worker
    entry = {
        "id": model_id,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "localspec",
        # what editors and routers read of a model: its context and the parameters it honours (Continue sends
        # `prediction` only to a model that lists it; OpenRouter-style clients and Aider read the context)
        "context_length": service.spec.n_ctx,
        "max_model_len": service.spec.n_ctx,
        "supported_parameters": SUPPORTED,
    }

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_id, "waiting": worker.waiting, "busy": worker.lock.locked()}

    @app.api_route("/", methods=["GET", "HEAD"])
    @app.get("/api/hello")
    async def hello() -> dict[str, Any]:  # Claude Code's first requests: is anything there
        return {"status": "ok", "model": model_id}

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [entry]}

    @v1.get("/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model != model_id:
            raise ApiError(404, f"the model '{model}' does not exist here", param="model", code="model_not_found")
        return entry
