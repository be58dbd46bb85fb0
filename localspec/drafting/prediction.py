"""Drafting from a prediction of the output that the caller supplies (OpenAI's Predicted Outputs).

An editor asking for a rewritten file knows most of the answer: the file itself. The prediction is
a draft source like any other, so the output stays exactly the target's: where the output follows
the prediction, it is verified in wide batches; where it departs (an edit), the copier resynchronizes
on the prediction after the edit, as it does on the prompt.
"""

from __future__ import annotations

from dataclasses import replace

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer, Verdict
from localspec.drafting.copier import Copier, LineJoin
from localspec.drafting.costs import CostModel

_EDGE = -1  # marks the prediction's ends in the copier's view (never a token)


class PredictionDrafter(Drafter):
    """Proposes the continuation of the prediction from where the output is.

    It runs a copier over a view of [edge, prediction, edge, output so far]: at the start the view ends
    with an edge, which matches the first edge, so the copy starts at the prediction's beginning;
    after an edit the copier finds where the output rejoins the prediction.
    """

    name = "prediction"

    def __init__(self, prediction: list[int], join: LineJoin | None = None) -> None:
        self.prediction = list(prediction)
        self.copier = Copier(join)
        self._prompt_len = 0

    def _view(self, ctx: list[int]) -> list[int]:
        return [_EDGE, *self.prediction, _EDGE, *ctx[self._prompt_len :]]

    def _proposal(self, ctx: list[int], k_max: int) -> list[int]:
        proposal = self.copier.propose(self._view(ctx), k_max)
        return proposal[: proposal.index(_EDGE)] if _EDGE in proposal else proposal

    def begin(self, prompt_len: int, *, fill: bool = False) -> None:
        self._prompt_len = prompt_len
        self.copier.begin(len(self.prediction) + 2)  # the prediction is the copier's "input" side

    def reset(self) -> None:
        self.copier.reset()

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        return Offer(self.copier.holds(len(self._proposal(ctx, k_max))))

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        return list(self._proposal(ctx, k))

    def accept(self, ctx: list[int], verdict: Verdict) -> None:
        mine = replace(verdict, by=self.copier) if verdict.by is self else verdict
        self.copier.accept(self._view(ctx), mine)
