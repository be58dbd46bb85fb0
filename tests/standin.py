"""A model-free stand-in for LocalSpec, for the server's own behaviour (timeouts, connections, queues): real
Generations of a stand-in engine that write `piece` text `tokens` times, `pace` seconds a token."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from localspec.api import Generation
from localspec.core.sampling import SamplerSettings
from localspec.core.stats import Piece, Stats
from localspec.decoding.engine import Request


class Run:
    """What a Generation iterates: `tokens` pieces of text, `pace` seconds each."""

    def __init__(self, request: Request, piece: str, pace: float) -> None:
        self.request, self.piece, self.pace = request, piece, pace
        self.stats, self.tokens, self.logprobs, self.started = Stats(), [], None, False

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

    def generate(self, request: Request) -> Run:
        return Run(request, self.piece, self.pace)


class StandIn:
    """The LocalSpec the server uses, answering every prompt with `piece` repeated (max_tokens times)."""

    def __init__(self, piece: str = "word ", pace: float = 0.001, n_ctx: int = 10**6) -> None:
        self.config = SimpleNamespace(sampler=SamplerSettings(), seed=None)
        self.engine = SimpleNamespace(target=SimpleNamespace(n_ctx=n_ctx, tokenize=lambda s: [1] * len(s.split())))
        self.n_ctx = n_ctx
        self._engine = Engine(piece, pace)

    def tokens(self, prompt: Any, **_: Any) -> list[int]:
        text = prompt if isinstance(prompt, str) else " ".join(str(m.get("content")) for m in prompt)
        return [1] * (len(text.split()) + 4)

    def piece(self, token: int) -> bytes:
        return b"word "

    def generate(self, prompt: Any, *, max_tokens: int, seed: int | None = None, **_: Any) -> Generation:
        request = Request(tuple(self.tokens(prompt)), max_tokens, seed=seed or 0)
        return Generation(self._engine, request)  # type: ignore[arg-type]

    def check_response_format(self, form: Any) -> None:
        pass

    def save_costs(self) -> None:
        pass

    notes: Sequence[str] = ()
