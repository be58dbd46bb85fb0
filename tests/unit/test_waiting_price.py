"""A draft model's setup is priced against the tokens left, without a model."""

from __future__ import annotations

from support.costs import GPU_CURVE

from localspec.drafting.costs import CostModel
from localspec.drafting.draft_model import DraftModelDrafter


def test_setup_cost_is_priced_against_the_tokens_left() -> None:
    """A catch-up of 2,000 tokens is worth paying for a long answer, not for the last few tokens."""
    from types import SimpleNamespace

    from localspec.decoding.planner import Planner

    cost = CostModel(dict(GPU_CURVE), draft=0.002, draft_prefill=0.0004)
    drafter = DraftModelDrafter(SimpleNamespace(tokens=[], path="draft.gguf"), cost)  # type: ignore[arg-type]
    planner = Planner([drafter], k=None, cost=cost)
    ctx = list(range(2000))
    assert planner.plan(ctx, room=8).drafter is None
    assert planner.plan(ctx, room=400).drafter is drafter
