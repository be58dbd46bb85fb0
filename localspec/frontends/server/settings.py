"""How `localspec serve` serves, in one value: where it listens, whom it answers, and its limits."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.settings import checked, default


@dataclass(frozen=True)
class ServerSettings:
    """The server's settings, each checked against the settings table as the value is made (the command line's
    flags and the config file's `host` and `port` reach it alike)."""

    host: str = default("host")
    port: int = default("port")
    api_key: str | None = None  # every /v1 request must carry it (Authorization: Bearer KEY)
    model_alias: str | None = None  # the model id clients use (None: the target's name)
    log_prompts: bool = False  # prompt text in the access log
    allow_host: tuple[str, ...] = ()  # Host names answered beside loopback and `host` ('*': any)
    cors: tuple[str, ...] = ()  # web origins allowed to call it from a browser
    max_queue: int = default("max_queue")
    max_connections: int = default("max_connections")
    client_timeout: float = default("client_timeout")  # for headers and bodies, and for reading the answer
    max_body: int = default("max_body")

    def __post_init__(self) -> None:
        for name in ("host", "port", "max_queue", "max_connections", "client_timeout", "max_body"):
            checked(name, getattr(self, name))
