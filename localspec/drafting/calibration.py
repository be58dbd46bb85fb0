"""Measuring this machine's decode costs (the planner's input); the store (drafting.store) keeps them."""

from __future__ import annotations

import time

from localspec.drafting import store
from localspec.drafting.costs import CostModel
from localspec.drafting.kept import Kept
from localspec.llama.model import Model

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
_FILLER = 220  # a common token; the cost of a decode does not depend on which tokens it holds
_PREFILL = 64  # tokens of the draft's measured catch-up batch


def _timed(model: Model, n: int, logits: int) -> float:
    base = len(model.tokens)
    t0 = time.perf_counter()
    model.sync(model.tokens + [_FILLER] * n, logits)
    dt = time.perf_counter() - t0
    model.trim(base)
    return dt


def _measure_target(target: Model) -> CostModel:
    # Warm-up: the first decodes after a load run up to 30% slow (measured on a Q8_0 target), and a one-token
    # cost measured high stays high while drafting wins every round (no round then runs the target alone).
    for _ in range(3):
        _timed(target, 8, 1)
    sizes = [n for n in CALIBRATION_SIZES if n <= min(target.n_batch, target.n_ctx // 2)]
    return CostModel({n: min(_timed(target, n, n) for _ in range(3 if n <= 8 else 2)) for n in sizes})


def measure_draft(draft: Model, cost: CostModel) -> None:
    """Time the draft's one-token decodes and a batched catch-up; store them in cost (as measured)."""
    base = list(draft.tokens)
    draft.sync([*base, _FILLER], 1)
    t0 = time.perf_counter()
    for i in range(4):
        draft.sync(base + [_FILLER] * (i + 2), 1)
    cost.draft = (time.perf_counter() - t0) / 4
    draft.trim(len(base))
    n = min(_PREFILL, draft.n_batch, draft.n_ctx // 2)
    cost.draft_prefill = _timed(draft, n, 1) / n
    cost.bound()
    draft.trim(len(base))


def load_costs(target: Model, draft: Model | None) -> CostModel:
    """The cost model of this pair here, measuring what the store does not hold yet (for the bench)."""
    target_key = store.model_key(target)
    cost = store.costs(target_key)
    if cost is None:
        cost = _measure_target(target)
        store.keep(target_key, cost)
    if draft is not None:
        draft_key = store.model_key(draft)
        kept = store.kept(target_key, draft_key)
        if kept.measured:
            kept.price(cost)
        else:
            measure_draft(draft, cost)
            _keep(target_key, cost, draft_key, kept)
    return cost


def calibrate(target: Model, draft: Model | None) -> CostModel:
    """Measure the pair afresh now and keep that as its costs (`localspec doctor --recalibrate`)."""
    cost, target_key = _measure_target(target), store.model_key(target)
    if draft is None:
        store.keep(target_key, cost)
    else:
        measure_draft(draft, cost)
        draft_key = store.model_key(draft)
        _keep(target_key, cost, draft_key, store.kept(target_key, draft_key))
    return cost


def _keep(target_key: str, cost: CostModel, draft_key: str, kept: Kept) -> None:
    """Keep the draft model's measured costs (in `cost`) into what is kept of it, beside the target's curve."""
    kept.draft, kept.draft_prefill = cost.draft, cost.draft_prefill
    store.keep(target_key, cost, (draft_key, kept))
