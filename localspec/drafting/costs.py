"""Measured decode costs of this machine (the planner's input): a verify curve and the draft's cost.

A round that drafts k tokens costs k draft steps plus one target decode of k + 1 tokens and yields
1 + S_1 + ... + S_k tokens on average, where S_j is the probability that the first j drafts are
accepted. best_k picks the k with the most tokens per second, k = 0 (the target alone) included.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class CostModel:
    """Seconds of one target decode of n tokens (interpolated between measured n) and of one draft token.

    Both are kept as a shape times a scale: every target decode moves the scale, so the whole curve and
    the draft's cost follow a machine that got slower or faster (load, thermals), not just the sizes
    used, and the draft never looks cheap only because it last ran when the machine was idle.
    """

    verify: dict[int, float]
    draft: float = 0.0  # seconds of one draft token, at scale 1
    draft_prefill: float = 0.0  # seconds per token of a draft-model prefill (catching up), at scale 1
    ema: float = 0.3  # weight of a new measurement in the scale (the machine's speed now) ...
    shape_ema: float = 0.05  # ... and in the shape (this hardware's curve: steady, so learned slowly)
    scale: float = 1.0
    _ns: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._ns = sorted(self.verify)

    @property
    def draft_token(self) -> float:
        """Estimated seconds of one draft token now."""
        return self.scale * self.draft

    @property
    def draft_prefill_token(self) -> float:
        """Estimated seconds per token of a draft-model catch-up (a batched prefill) now."""
        return self.scale * (self.draft_prefill or self.draft)

    def verify_cost(self, n: int) -> float:
        """Estimated seconds for a target decode of n tokens, logits at all n."""
        return self.scale * self._shape(n)

    def curve(self) -> dict[int, float]:
        """The current estimate at every measured size (what is saved for the next run)."""
        return {n: self.verify_cost(n) for n in self._ns}

    def _shape(self, n: int) -> float:
        ns, v = self._ns, self.verify
        if n in v:
            return v[n]
        i = bisect.bisect_left(ns, n)
        if i == 0:
            return v[ns[0]] * n / ns[0]
        if i == len(ns):  # beyond the largest measured batch: grow at the last per-token slope
            a, b = ns[-2], ns[-1]
            return v[b] + (n - b) * max((v[b] - v[a]) / (b - a), v[b] / b * 0.5)
        a, b = ns[i - 1], ns[i]
        return v[a] + (v[b] - v[a]) * (n - a) / (b - a)

    def observe_verify(self, n: int, seconds: float) -> None:
        """Fold a measured decode into the scale and into the running average of its batch size.

        A lasting slowdown seen at one size goes mostly into the scale, not the shape, so it does not
        make other sizes (or the draft) look cheap; one measurement counts as at most twice the
        estimate (a decode stalled by a burst of load); a new size starts halfway between the
        interpolated and the measured cost.
        """
        ratio = min(max(seconds / self.verify_cost(n), 0.5), 2.0)
        self.scale *= ratio**self.ema
        shape, weight = self._shape(n), self.shape_ema if n in self.verify else 0.5
        self.verify[n] = shape * (1 - weight + weight * ratio ** (1 - self.ema))  # toward measured / new scale
        if len(self._ns) != len(self.verify):
            self._ns = sorted(self.verify)

    def observe_draft(self, seconds_per_token: float) -> None:
        """Fold a measured draft token into its running average (relative to the current scale)."""
        measured = min(max(seconds_per_token, 0.5 * self.draft_token), 2.0 * self.draft_token) or seconds_per_token
        self.draft += self.shape_ema * (measured / self.scale - self.draft)


def best_k(survival: Sequence[float], cost: CostModel, draft_cost: float) -> tuple[int, float]:
    """(k, tokens per second) maximizing (1 + S_1 + ... + S_k) / (k * draft_cost + t_verify(k + 1))."""
    best, best_rate, expected = 0, 1.0 / cost.verify_cost(1), 1.0
    for k, s in enumerate(survival, 1):
        expected += s
        rate = expected / (k * draft_cost + cost.verify_cost(k + 1))
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate


def amortized(rate: float, setup: float, horizon: int) -> float:
    """Tokens per second over the next `horizon` tokens when `setup` seconds are paid once first."""
    return horizon / (horizon / rate + setup) if setup > 0 and horizon > 0 else rate
