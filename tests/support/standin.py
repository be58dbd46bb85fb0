"""A model-free stand-in for LocalSpec, for the server's own behaviour (timeouts, connections, queues): real
Generations of a stand-in engine that write `piece` text `tokens` times, `pace` seconds a token; and the real app
over it, served by uvicorn on a free local port (`Served`)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import uvicorn
from stall_check import free_port

from localspec.api import ContextFull, Generation, Options, Prepared
from localspec.core.sampling import SamplerSettings
from localspec.core.stats import Piece, Stats
from localspec.decoding.engine import Request
from localspec.frontends.server.app import create_app
from localspec.frontends.server.run import server_config
from localspec.frontends.server.settings import ServerSettings


class Run:
    """What a Generation iterates: `tokens` pieces of text, `pace` seconds each."""

    def __init__(self, request: Request, piece: str, pace: float, cache_miss: str | None = None) -> None:
        self.request, self.piece, self.pace = request, piece, pace
        self.stats, self.tokens, self.logprobs, self.started = Stats(cache_miss=cache_miss), list[int](), None, False

    def __iter__(self) -> Iterator[Piece]:
        self.started = True
        self.stats.prompt_tokens = len(self.request.prompt)
        try:
            for _ in range(self.request.max_tokens):
                time.sleep(self.pace)
                self.tokens.append(7)
                self.stats.completion_tokens += 1
                yield Piece(self.piece, False)
        finally:
            self.stats.finish_reason = "length"


class Engine:
    def __init__(self, piece: str, pace: float) -> None:
        self.piece, self.pace = piece, pace
        self.drafters: list[Any] = []  # as the real engine's, where nothing drafts
        self.cache_miss: str | None = None  # what the prompt cache says of every prompt

    def generate(self, request: Request) -> Run:
        return Run(request, self.piece, self.pace, self.cache_miss)


class StandIn:
    """The LocalSpec the server uses, answering every prompt with `piece` repeated (max_tokens times)."""

    def __init__(self, piece: str = "word ", pace: float = 0.001, n_ctx: int = 10**6) -> None:
        self.config = SimpleNamespace(sampler=SamplerSettings(), seed=None)
        self.n_ctx = n_ctx
        self._engine = Engine(piece, pace)
        self.prepared = self.tokenized = 0  # requests made ready, and texts tokenized (prompts, predictions)
        self.options: Options | None = None  # the last request's

    def tokenize(self, text: str) -> list[int]:
        self.tokenized += 1
        return [1] * len(text.split())

    def tokens(self, prompt: Any, *, tools: Any = None, **_: Any) -> list[int]:
        """A word a token, the tools' descriptions counted as the chat template renders them."""
        self.tokenized += 1
        text = prompt if isinstance(prompt, str) else " ".join(str(m.get("content")) for m in prompt)
        return [1] * (len(text.split()) + len(json.dumps(tools).split() if tools else ()) + 4)

    def piece(self, token: int) -> bytes:
        return b"word "

    def prepare(self, prompt: Any, options: Options) -> Prepared:
        self.prepared += 1  # what a request costs here: one tokenization, one check of the context
        self.options = options
        tools = options.tools if options.tool_choice != "none" else None
        tokens = self.tokens(prompt, tools=tools)
        if len(tokens) >= self.n_ctx:
            raise ContextFull(f"the prompt is {len(tokens)} tokens and the context holds {self.n_ctx}")
        predicted = len(self.tokenize(options.prediction)) if options.prediction else 0
        request = Request(tuple(tokens), options.max_tokens or 16, seed=options.seed or 0)
        return Prepared(request, tuple(t["function"]["name"] for t in tools or []), predicted)

    def run(self, prepared: Prepared) -> Generation:
        return Generation(self._engine, prepared.request, prepared.tool_names)  # type: ignore[arg-type]

    def check_response_format(self, form: Any) -> None:
        pass

    def save_costs(self) -> None:
        pass

    notes: Sequence[str] = ()


class Served:
    """The app over `spec`, served by uvicorn in a thread as `localspec serve` serves it."""

    def __init__(
        self,
        spec: StandIn,
        *,
        timeout: float = 1.0,
        max_connections: int = 64,
        max_queue: int = 16,
        api_key: str | None = None,
        n_ctx: int | None = None,
    ) -> None:
        self.log: list[str] = []
        self.spec = spec
        if n_ctx is not None:
            spec.n_ctx = n_ctx
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        settings = ServerSettings(
            port=self.port,
            api_key=api_key,
            max_queue=max_queue,
            max_connections=max_connections,
            client_timeout=timeout,
        )
        app = create_app(spec, settings, model_id="standin", log=self.log.append)  # type: ignore[arg-type]
        self.server = uvicorn.Server(server_config(app, settings))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        until(lambda: self.server.started, "the server to start")

    @property
    def connections(self) -> int:
        return len(self.server.server_state.connections)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@contextlib.contextmanager
def serving(spec: StandIn, **options: Any) -> Iterator[Served]:
    """The app over `spec`, served while the block runs; its log shows no traceback."""
    s = Served(spec, **options)
    try:
        yield s
    finally:
        s.stop()
    assert not any("Traceback" in line for line in s.log), s.log


def until(condition: Callable[[], object], what: str, seconds: float = 60) -> None:
    """Wait for an event: `condition` holding (looked at every 20 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.02)
