"""Running the server: the pair loaded, the app made, uvicorn started with the timeouts and limits."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn

from localspec.api import LocalSpec, RunConfig, model_id
from localspec.frontends.generate import loading
from localspec.frontends.server.app import create_app
from localspec.frontends.server.guard import allowed_hosts
from localspec.frontends.server.http import open_files_limit, timed_protocol


def server_config(app: Any, host: str, port: int, client_timeout: float, max_connections: int) -> uvicorn.Config:
    """uvicorn's settings for `app`: its connections timed and capped (server.http)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=timed_protocol(client_timeout, max_connections),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
    )


def serve_forever(
    cfg: RunConfig,
    *,
    host: str,
    port: int,
    api_key: str | None,
    model_alias: str | None,
    max_queue: int,
    log_prompts: bool,
    allow_host: Sequence[str],
    cors: Sequence[str],
    max_body: int,
    client_timeout: float,
    max_connections: int,
) -> None:
    """Load the pair of `cfg` and serve it until Ctrl-C or SIGTERM, then keep what the session learned."""
    hosts, warning = allowed_hosts(host, allow_host, api_key)
    if warning:
        print(f"localspec: WARNING: {warning}", file=sys.stderr)
    with loading("loading models…"):
        spec = LocalSpec.from_config(cfg)
    for note in spec.notes:
        print(f"localspec: {note}", file=sys.stderr)
    name = model_alias or model_id(cfg)
    app = create_app(
        spec,
        model_id=name,
        api_key=api_key,
        max_queue=max_queue,
        log_prompts=log_prompts,
        hosts=hosts,
        cors=frozenset(cors),
        max_body=max_body,
        body_seconds=client_timeout,
        stall_seconds=client_timeout,
    )
    open_files_limit(max_connections)
    server = uvicorn.Server(server_config(app, host, port, client_timeout, max_connections))
    print(f"localspec: serving '{name}' at http://{host}:{port}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again: let that end the command normally
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        spec.save_costs()
