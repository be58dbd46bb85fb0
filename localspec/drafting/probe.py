"""A batch probe: what a small batch costs here, measured once before a draft model is explored for it.

Whether a draft model can win turns on what verifying a few tokens at once costs against one: on a GPU about
the same, on a CPU nearly as much as decoding them one by one, and a prefill (hundreds of tokens, logits at one
row) says little of it. Where the kept curve knows no small batch, this drafter proposes the last token again,
PROBE_ROWS - 1 times, once: the target's verification keeps a guessed token only where it is the target's own,
so the text is unchanged, and the batch's time teaches the curve (about one extra decode, once per machine).
"""

from __future__ import annotations

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter
from localspec.drafting.costs import PROBE_ROWS, CostModel
from localspec.drafting.policy import DraftPolicy

SMALL = range(2, 9)  # a curve that knows one of these batch sizes needs no probe


class BatchProbe(Drafter):
    """Measures one small batch where a draft model is explored and the curve knows none (see the module)."""

    name = "batch_probe"

    def __init__(self, policy: DraftPolicy) -> None:
        self.policy = policy
        self.done = False

    def survival(self, ctx: list[int], k_max: int) -> list[float]:
        return []

    def probe(self, ctx: list[int], room: int, cost: CostModel) -> int:
        wanted = self.policy.choice == "explore" and not self.policy.dropped and 1 in cost.verify
        if self.done or not wanted or room < PROBE_ROWS - 1 or any(n in cost.verify for n in SMALL):
            return 0
        self.done = True
        return PROBE_ROWS - 1

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        return ctx[-1:] * k
