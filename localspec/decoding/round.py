"""One speculative round: plan, draft, cut to the grammar, verify in one target batch, sample, trim, learn.

The round holds the algorithm alone: its `Meter` keeps the time (spans, the decodes inside them) and the cost
model learns from the round's record in one place (CostModel.learn). scripts/simulate.py drives this same round
with a simulated clock and stand-ins for the models and the verification.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from localspec.core.grammar import Constraint
from localspec.core.meter import Meter
from localspec.core.sampling import (
    Dist,
    InvariantSampling,
    OneHot,
    SamplerSettings,
    TokenLogprob,
    process,
    token_logprob,
    top_probability,
)
from localspec.decoding.planner import NONE, Planner
from localspec.drafting.base import Drafter
from localspec.drafting.costs import CostModel


class Target(Protocol):
    """What a round asks of the target model (llama.model.Model)."""

    n_vocab: int

    def sync(self, tokens: list[int], n_logits: int = 1, skip: Sequence[bool] = ()) -> np.ndarray:
        """Make the cache hold `tokens`; the logits of the last n_logits positions (but the skipped)."""

    def trim(self, n: int) -> None:
        """Keep the first n cached positions."""


@dataclass
class Outcome:
    """What one round emitted: its tokens (the accepted draft first), and how it got them."""

    tokens: list[int]
    accepted: int
    drafter: Drafter | None
    drafted: int
    logprobs: list[TokenLogprob]  # one per token when asked for


@dataclass
class Round:
    """The speculative step of one generation (called once a round). `pending`: the target's logits already
    computed (the prefill's, for the first token); `top_logprobs` asks for each token's log-probabilities."""

    target: Target
    planner: Planner
    sampler: SamplerSettings
    sampling: InvariantSampling
    grammar: Constraint | None
    cost: CostModel | None
    meter: Meter
    top_logprobs: int | None = None
    pending: np.ndarray | None = None

    def __call__(self, ctx: list[int], room: int) -> Outcome:
        """One round on ctx. The target cache holds ctx[:-1], or all of ctx where `pending` holds the next
        logits (then they are sampled before any draft: the first token comes as soon as the target alone's);
        the grammar, if any, has consumed ctx's output."""
        meter, grammar = self.meter, self.grammar
        meter.start()
        plan = NONE if self.pending is not None else self.planner.plan(ctx, room)
        with meter.span("draft"):
            draft = plan.drafter.draft(ctx, plan.k, self.sampler, self.sampling) if plan.drafter else []
        meter.times.drafted = len(draft)
        if grammar is not None and draft:  # a draft goes only as far as the grammar allows it
            draft = draft[: grammar.valid_prefix(draft)]
        with meter.span("verify"):
            at = self._verify(ctx, draft)
        rows: list[np.ndarray | None] = []  # at each emitted position, under the grammar
        with meter.span("sample"):
            tokens, n = self.sampling.verify(self._dists(at, draft, rows), draft, len(ctx))
        if grammar is not None:
            grammar.advance(tokens[-1])
        self.target.trim(len(ctx) + n)  # keep the accepted prefix; the new token is decoded next round
        computed = [r for r in rows if r is not None]
        meter.times.positions = len(computed)
        sure = [top_probability(computed[-1])] * len(computed) if computed and self.planner.confident else []
        plan = plan if plan.k == len(draft) else replace(plan, k=len(draft))
        self.planner.accept(ctx + tokens, plan, n, sure, meter.read())
        top = self.top_logprobs
        logprobs = [token_logprob(r, t, top) for r, t in zip(rows, tokens, strict=True)] if top is not None else []
        if self.cost is not None:
            self.cost.learn(meter.read())
        return Outcome(tokens, n, plan.drafter, len(draft), logprobs)

    def _verify(self, ctx: list[int], draft: list[int]) -> list[np.ndarray | None]:
        """The target's logits at each position of the draft and the one after, in one batch (None where the
        grammar allows one token alone: no logits are needed to choose it)."""
        decided = self.grammar.decided(draft) if self.grammar is not None else [False] * len(draft)
        if self.pending is not None:
            logits, self.pending = iter(self.pending), None
        else:
            logits = iter(self.target.sync(ctx + draft, len(draft) + 1, decided))
            self.meter.times.rows, self.meter.times.whole = len(draft) + 1, not any(decided)
        return [*(None if d else next(logits) for d in decided), next(logits)]

    def _dists(
        self, at: list[np.ndarray | None], draft: list[int], rows: list[np.ndarray | None]
    ) -> Callable[[int], Dist]:
        """The target's distribution at each position from its logits `at` them, asked for in order while the
        draft holds; each row, under the grammar, is kept in `rows`."""
        grammar, sampler = self.grammar, self.sampler

        def p_at(i: int) -> Dist:
            row = at[i]
            if grammar is not None:
                if i:
                    grammar.advance(draft[i - 1])
                row = None if row is None else grammar.mask(row)
            rows.append(row)
            return OneHot(draft[i]) if row is None else process(row, sampler)

        return p_at
