"""Cost-aware choice of the draft length k: measured costs on this machine, expected tokens per second.

A round that drafts k tokens costs k draft steps plus one target decode of k + 1 tokens and yields
1 + S_1 + ... + S_k tokens on average, where S_j is the probability that the first j drafts are
accepted (alpha^j for a model draft). The controller picks the k with the most tokens per second,
k = 0 (the target alone) included.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence

from localspec.ngram import NgramDrafter


@dataclass
class CostModel:
    """Seconds of one target decode of n tokens (interpolated between measured n) and of one draft token.

    Both are kept as a shape times a scale: every target decode moves the scale, so the whole curve and
    the draft's cost follow a machine that got slower or faster (load, thermals), not just the sizes
    used, and the draft never looks cheap only because it last ran when the machine was idle.
    """

    verify: dict[int, float]
    draft: float = 0.0  # seconds of one draft token, at scale 1
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
        self.scale *= ratio ** self.ema
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


@dataclass
class Acceptance:
    """Running estimate of a model draft's per-token acceptance rate alpha (decayed counts)."""

    accepted: float = 4.0
    rejected: float = 1.0
    decay: float = 0.95

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.accepted = self.decay * self.accepted + accepted
            self.rejected = self.decay * self.rejected + (accepted < drafted)

    def survival(self, k_max: int) -> list[float]:
        a = self.alpha
        return [a ** j for j in range(1, k_max + 1)]


@dataclass(frozen=True)
class Plan:
    """What one round drafts: nothing (target alone), k model tokens, or the given n-gram tokens."""

    kind: str  # "none" | "model" | "ngram"
    k: int
    tokens: tuple[int, ...] = ()


NONE = Plan("none", 0)


class Planner:
    """Chooses each round's draft: n-gram copy, model draft, or none, and its length.

    With a fixed k, an n-gram match is used when there is one, else the model draft. With k = None
    (auto), every option's expected tokens per second is computed from the measured costs and the
    tracked acceptance, and the best wins; the model draft is re-probed with k = 1 now and then
    (backing off while it keeps losing) so the choice can switch back.
    """

    NGRAM_MAX = 64
    MODEL_MAX = 16
    PROBE_ALPHA = 0.9  # the acceptance rate a probe hopes for: a good draft on easy text

    def __init__(self, *, model: bool, ngram: NgramDrafter | None, k: int | None, cost: CostModel | None) -> None:
        if k is None and cost is None:
            raise ValueError("automatic k needs a cost model")
        self.model, self.ngram, self.k, self.cost = model, ngram, k, cost
        self.acceptance = Acceptance()
        self.probe_every, self._since_model = 8, 0

    def plan(self, ctx: list[int], room: int) -> Plan:
        """The draft for the next round; room is the most tokens it may propose."""
        if room <= 0:
            return NONE
        prop = self.ngram.propose(ctx, min(room, self.NGRAM_MAX if self.k is None else self.k)) if self.ngram else []
        if self.k is not None:
            if prop:
                return Plan("ngram", len(prop), tuple(prop))
            return Plan("model", min(self.k, room)) if self.model and self.k else NONE
        best, rate = NONE, 1.0 / self.cost.verify_cost(1)
        if prop:
            k, r = best_k(self.ngram.survival(len(prop)), self.cost, 0.0)
            if r > rate:
                best, rate = Plan("ngram", k, tuple(prop[:k])), r
        if self.model:
            k, r = best_k(self.acceptance.survival(min(room, self.MODEL_MAX)), self.cost, self.cost.draft_token)
            if r > rate:
                best = Plan("model", k)
            elif best is NONE and self._since_model >= self.probe_every and self._model_can_win(room):
                best = Plan("model", 1)  # a probe: cheap, and it keeps alpha current
        return best

    def _model_can_win(self, room: int) -> bool:
        """Whether the draft model would beat the target alone at PROBE_ALPHA.

        A probe is not just one verify: the draft first catches up on every token since it last ran.
        On a machine where even a good draft barely wins (a CPU), that price is never repaid.
        """
        survival = [self.PROBE_ALPHA ** j for j in range(1, min(room, self.MODEL_MAX) + 1)]
        return best_k(survival, self.cost, self.cost.draft_token)[0] > 0

    def observe(self, ctx: list[int], plan: Plan, accepted: int) -> None:
        """Learn from a finished round; ctx already ends with the tokens it emitted."""
        if plan.kind == "model":
            self.acceptance.observe(plan.k, accepted)
            if self._since_model >= self.probe_every and self.k is None:  # that was a probe
                won = best_k(self.acceptance.survival(self.MODEL_MAX), self.cost, self.cost.draft_token)[0] > 0
                self.probe_every = 8 if won else min(2 * self.probe_every, 256)
            self._since_model = 0
            if self.ngram:
                self.ngram.reset()  # the model's tokens moved the output: resynchronize
        else:
            self._since_model += 1
            if self.ngram:
                self.ngram.observe(ctx, accepted)
