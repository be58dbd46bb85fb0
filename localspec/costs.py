"""Measuring this machine's decode costs (the controller's input), cached per model and settings."""

from __future__ import annotations

import json
import time

from localspec.controller import CostModel
from localspec.dirs import cache_dir
from localspec.model import Model

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
_FILLER = 220  # a common token; the cost of a decode does not depend on which tokens it holds


def _key(model: Model) -> str:
    st = model.path.stat()
    return f"{model.path.resolve()}|{st.st_size}|{st.st_mtime_ns}|t{model.n_threads}|g{model.n_gpu_layers}|c{model.n_ctx}"


def _timed(model: Model, n: int, logits: int) -> float:
    base = len(model.tokens)
    t0 = time.perf_counter()
    model.sync(model.tokens + [_FILLER] * n, logits)
    dt = time.perf_counter() - t0
    model.trim(base)
    return dt


def _measure(target: Model, draft: Model | None) -> CostModel:
    _timed(target, 4, 1)  # warm-up
    sizes = [n for n in CALIBRATION_SIZES if n <= min(target.n_batch, target.n_ctx // 2)]
    verify = {n: min(_timed(target, n, n) for _ in range(2)) for n in sizes}
    draft_token = 0.0
    if draft is not None:
        base = list(draft.tokens)
        draft.sync(base + [_FILLER], 1)
        t0 = time.perf_counter()
        for i in range(4):
            draft.sync(base + [_FILLER] * (i + 2), 1)
        draft_token = (time.perf_counter() - t0) / 4
        draft.trim(len(base))
    return CostModel(verify, draft_token)


def _store() -> dict:
    try:
        return json.loads((cache_dir() / "costs.json").read_text())
    except (OSError, ValueError):
        return {}


def load_costs(target: Model, draft: Model | None) -> CostModel:
    """The cost model of this pair here: from the cache, else measured now (a few seconds on a CPU)."""
    entry = _store().get(_key(target))
    if entry and (draft is None or _key(draft) in entry.get("draft", {})):
        verify = {int(n): s for n, s in entry["verify"].items()}
        return CostModel(verify, entry["draft"].get(_key(draft), 0.0) if draft else 0.0)
    cost = _measure(target, draft)
    save_costs(target, draft, cost)
    return cost


def save_costs(target: Model, draft: Model | None, cost: CostModel) -> None:
    """Keep the (running-average) costs for the next run; never fails the caller."""
    store = _store()
    entry = store.setdefault(_key(target), {"draft": {}})
    entry["verify"] = {str(n): s for n, s in cost.curve().items() if n in CALIBRATION_SIZES or n <= 64}
    if draft is not None:
        entry.setdefault("draft", {})[_key(draft)] = cost.draft_token
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        tmp = cache_dir() / "costs.json.tmp"
        tmp.write_text(json.dumps(store, indent=1))
        tmp.replace(cache_dir() / "costs.json")
    except OSError:
        pass
