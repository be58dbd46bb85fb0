"""A batch probe: what a small batch costs here, measured once before a draft model is explored for it.

Whether a draft model can win turns on what verifying a few tokens at once costs against one: on a GPU about
the same, on a CPU nearly as much as decoding them one by one, and a prefill (hundreds of tokens, logits at one
row) says little of it. Where the kept curve does not know them, this drafter proposes the last token again so
that a batch of 2 rows and one of PROBE_ROWS are verified, once each: the target's verification keeps a guessed
token only where it is the target's own, so the text is unchanged, and the batches' times teach the curve
(about one extra decode, once per machine) and tell a compute-bound machine from the Metal backend's dearer
2-row shape (CostModel.compute_share).
"""

from __future__ import annotations

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer, Verdict
from localspec.drafting.costs import PROBE_ROWS, CostModel
from localspec.drafting.policy import SEEN_TOKENS, DraftPolicy


class BatchProbe(Drafter):
    """Measures two small batches where a draft model is explored and the curve lacks them (see the module)."""

    name = "batch_probe"

    def __init__(self, policy: DraftPolicy) -> None:
        self.policy = policy
        self.done: set[int] = set()  # the batch sizes it measured
        self._answer_start, self._offered = 0, 1

    def begin(self, prompt_len: int, *, fill: bool = False) -> None:
        self._answer_start = prompt_len

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        self._offered = self._rows(ctx, room, cost)
        return Offer(probe=self._offered - 1)

    def _rows(self, ctx: list[int], room: int, cost: CostModel | None) -> int:
        """The batch to measure now (1: none)."""
        wanted = cost is not None and self.policy.choice == "explore" and not self.policy.dropped and 1 in cost.verify
        # after the answer's first tokens: the first decodes after a load run slow, and the text is seen by then
        if not wanted or room < PROBE_ROWS - 1 or len(ctx) - self._answer_start < SEEN_TOKENS:
            return 1
        assert cost is not None
        # the smaller first: each is then beyond the largest measured, taken as is
        return next((n for n in (2, PROBE_ROWS) if n not in cost.verify and n not in self.done), 1)

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        return ctx[-1:] * k

    def accept(self, ctx: list[int], verdict: Verdict) -> None:
        if verdict.by is self:  # measured, or cut by a grammar: asked once either way
            self.done.add(self._offered)
