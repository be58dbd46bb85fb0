"""One round's times: scoped spans on one clock, and the decodes run inside them (llama.cpp's common_time_meas).

A `Meter` times a round in spans (`draft`, `verify`, `sample`); a model reports each decode it runs with
`decoded`, which the span open on the calling thread keeps. `Times` is the record a round leaves: what the cost
model learns from (CostModel.learn) and what a round's verdict carries. Decodes on other threads (a draft model
catching up while it loads) belong to no round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

SPANS = ("draft", "verify", "sample")
_OPEN: ContextVar[tuple[Times, str] | None] = ContextVar("localspec_meter_span", default=None)


@dataclass
class Times:
    """One round's seconds: `total` from its start, each span's, and the decodes run in each span (tokens, seconds);
    `rows` the target's rows decoded to verify (0: the logits were at hand), `whole` whether all of them had
    logits (a grammar's certain tokens need none: fewer rows cost less), `positions` the positions sampled,
    `drafted` the tokens the drafter proposed (before a grammar cut them)."""

    total: float = 0.0
    spans: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SPANS, 0.0))
    decodes: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: {s: [] for s in SPANS})
    rows: int = 0
    whole: bool = True
    positions: int = 0
    drafted: int = 0

    def decoding(self, span: str) -> float:
        """The seconds in `span` spent inside the models (their decodes and loads)."""
        return sum(seconds for _, seconds in self.decodes[span])

    @property
    def host(self) -> float:
        """The round's seconds outside the decodes, the sampling and the drafter's call: the loop's own."""
        return self.total - self.spans["draft"] - self.decoding("verify") - self.spans["sample"]

    @property
    def draft_host(self) -> float:
        """The drafter's seconds outside its decodes."""
        return self.spans["draft"] - self.decoding("draft")


class Meter:
    """Times rounds on `clock`: `start` one, time its parts in `span`s, `read` the record so far."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.times = Times()
        self._start = 0.0

    def start(self) -> None:
        """A round begins: a fresh record."""
        self.times, self._start = Times(), self.clock()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Time the block as `name`; decodes reported inside it are kept as its."""
        token, t0 = _OPEN.set((self.times, name)), self.clock()
        try:
            yield
        finally:
            self.times.spans[name] += self.clock() - t0
            _OPEN.reset(token)

    def read(self) -> Times:
        """The round's record, its total up to now."""
        self.times.total = self.clock() - self._start
        return self.times


def decoded(tokens: int, seconds: float) -> None:
    """A model ran a decode of `tokens` in `seconds` (0 tokens: it loaded): kept by the span open on this thread,
    if any."""
    if (open_ := _OPEN.get()) is not None:
        times, name = open_
        times.decodes[name].append((tokens, seconds))
