"""The batch probe: what a small batch costs here, measured once before a draft model is explored for it."""

from __future__ import annotations

from typing import Protocol

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer, Verdict
from localspec.drafting.costs import PROBE_ROWS, CostModel
from localspec.drafting.prior import SEEN_TOKENS


class Explored(Protocol):
    """What the probe asks of the draft model's policy (policy.DraftPolicy)."""

    @property
    def choice(self) -> str:
        """Its session's choice (the probe measures for an exploration)."""

    @property
    def dropped(self) -> bool:
        """Whether it drafts no more in this session."""

    def worth_measuring(self, answer: int, room: int) -> bool:
        """Whether what it measures could matter over the horizon now."""


class BatchProbe(Drafter):
    """What a small batch costs here, measured once before a draft model is explored for it, where the horizon
    could repay a load (`DraftPolicy.worth_measuring`: in a short answer nothing it measures could matter).

    Whether a draft model can win turns on what verifying a few tokens at once costs against one: on a GPU about
    the same, on a CPU nearly as much as decoding them one by one, and a prefill (hundreds of tokens, logits at one
    row) says little of it. Where the kept curve does not know them, it probes: it proposes the last token again
    so that a batch of 2 rows and one of PROBE_ROWS are verified, once each. The target keeps a guessed token only
    where it is the target's own, so the text is unchanged, and the batches' times teach the curve (about one extra
    decode, once per machine) and tell a compute-bound machine from the Metal backend's dearer 2-row shape
    (CostModel.compute_share)."""

    name = "batch_probe"

    def __init__(self, policy: Explored) -> None:
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
        answer = len(ctx) - self._answer_start
        # after the answer's first tokens: the first decodes after a load run slow, and the text is seen by then
        if not wanted or room < PROBE_ROWS - 1 or answer < SEEN_TOKENS:
            return 1
        assert cost is not None
        if not self.policy.worth_measuring(answer, room):  # nothing it measures could matter yet
            return 1
        # the smaller first: each is then beyond the largest measured, taken as is
        return next((n for n in (2, PROBE_ROWS) if n not in cost.verify and n not in self.done), 1)

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        return ctx[-1:] * k

    def accept(self, ctx: list[int], verdict: Verdict) -> None:
        if verdict.by is self:  # measured, or cut by a grammar: asked once either way
            self.done.add(self._offered)
