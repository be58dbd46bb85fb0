"""Choosing each round's draft: which drafter, and how many tokens, from the measured costs.

Under automatic k every drafter's best option is priced in expected tokens per second (its survival
curve, its per-token cost, a one-off setup amortized over the tokens still to come) against the
target alone, and the best wins. With a fixed k the first drafter with something to propose drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.core.meter import Times
from localspec.drafting.base import MARGIN, Drafter, Verdict, priced
from localspec.drafting.costs import CostModel


@dataclass(frozen=True)
class Plan:
    """What one round drafts: k tokens from a drafter, or nothing (the target alone); `probe` when it is the
    drafter's probe (Offer.probe) rather than a priced win."""

    drafter: Drafter | None
    k: int
    probe: bool = False


NONE = Plan(None, 0)


class Planner:
    """Picks a drafter and k each round; k=None is the cost-aware choice (needs `cost`)."""

    def __init__(self, drafters: Sequence[Drafter], *, k: int | None, cost: CostModel | None) -> None:
        if k is None and cost is None:
            raise ValueError("automatic k needs a cost model")
        self.drafters, self.k, self.cost = list(drafters), k, cost
        # whether a drafter learns from the target's confidence (Verdict.confidence)
        self.confident = any(d.confident for d in self.drafters)

    def plan(self, ctx: list[int], room: int) -> Plan:
        """The draft for the next round; room is the most tokens it may propose."""
        if room <= 0 or self.k == 0:
            return NONE
        if self.k is not None:
            for d in self.drafters:  # the first with a proposal drafts it: no price asked (cost None)
                if n := len(d.offer(ctx, min(room, self.k), room, None).survival):
                    return Plan(d, n)
            return NONE
        cost = self.cost
        assert cost is not None
        if not cost.measured:  # nothing to price a draft against before the first decode
            return NONE
        best, rate, probe = NONE, MARGIN / cost.alone, NONE
        for d in self.drafters:
            offer = d.offer(ctx, min(room, d.max_k), room, cost)
            if offer.probe and probe is NONE:
                probe = Plan(d, offer.probe, probe=True)
            if not offer.survival:
                continue
            if d.certain:
                return Plan(d, len(offer.survival))
            k, r = priced(offer, cost, room)
            if k and r > rate:
                best, rate = Plan(d, k), r
        return probe if best is NONE else best

    def accept(
        self, ctx: list[int], plan: Plan, accepted: int, confidence: Sequence[float] = (), times: Times | None = None
    ) -> None:
        """Every drafter learns from a finished round; ctx already ends with the tokens it emitted, plan.k is what
        was drafted, `times` the round's record (Verdict)."""
        verdict = Verdict(plan.drafter, plan.k, accepted, confidence, plan.probe, times or Times())
        for d in self.drafters:
            d.accept(ctx, verdict)
