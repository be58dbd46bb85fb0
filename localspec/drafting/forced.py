"""Drafting what a grammar forces: where it allows one continuation only (a key name, a quote, the rest
of an enum value), that continuation is known before the model runs (SGLang's jump-forward decoding).

The target still verifies it: a forced run is proposed in llguidance's canonical tokens, and the
target may spell the same text with other tokens, so the round keeps whatever the target emits.
"""

from __future__ import annotations

from typing import ClassVar

from localspec.core.grammar import Constraint
from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer
from localspec.drafting.costs import CostModel

HOLDS = 0.99  # a forced token is the target's own but for another spelling of the same text


class ForcedDrafter(Drafter):
    """Proposes the tokens the generation's grammar forces from here."""

    name = "forced"
    certain: ClassVar[bool] = True

    def __init__(self, constraint: Constraint) -> None:
        self.constraint = constraint

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        return Offer([HOLDS**j for j in range(1, len(self.constraint.forced()[:k_max]) + 1)])

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        return self.constraint.forced()[:k]
