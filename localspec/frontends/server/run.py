"""Running the server: the pair loaded, the app made, uvicorn started with the timeouts and limits."""

from __future__ import annotations

import signal
import sys
from dataclasses import replace
from typing import Any

import uvicorn

from localspec.api import LocalSpec, RunConfig, model_id
from localspec.frontends.generate import loading
from localspec.frontends.server.app import create_app
from localspec.frontends.server.guard import allowed_hosts
from localspec.frontends.server.http import open_files_limit, timed_protocol
from localspec.frontends.server.settings import ServerSettings


def server_config(app: Any, settings: ServerSettings) -> uvicorn.Config:
    """uvicorn's settings for `app`: where it listens, its connections timed and capped (server.http)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=timed_protocol(settings.client_timeout, settings.max_connections),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
    )


def serve_forever(cfg: RunConfig, settings: ServerSettings) -> None:
    """Load the pair of `cfg` and serve it as `settings` say until Ctrl-C or SIGTERM, then keep what the session
    learned."""
    warning = allowed_hosts(settings.host, settings.allow_host, settings.api_key)[1]
    if warning:
        print(f"localspec: WARNING: {warning}", file=sys.stderr)
    with loading("loading models…"):
        spec = LocalSpec.from_config(replace(cfg, session=True))  # many answers: the draft model's horizon
    for note in spec.notes:
        print(f"localspec: {note}", file=sys.stderr)
    name = settings.model_alias or model_id(cfg)
    app = create_app(spec, settings, model_id=name)
    open_files_limit(settings.max_connections)
    server = uvicorn.Server(server_config(app, settings))
    where = f"http://{settings.host}:{settings.port}/v1"
    print(f"localspec: serving '{name}' at {where} (Ctrl-C stops)", file=sys.stderr, flush=True)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again: let that end the command normally
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        spec.save_costs()
