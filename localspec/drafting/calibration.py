"""Measuring this machine's decode costs (the planner's input), cached per model file and settings.

The cache (costs.json in the user's cache directory) keys the target's verify curve by its file and
settings, and each draft model's costs under it by the draft's, so whether a draft model can ever
win here is known before the draft is loaded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localspec.drafting.costs import CostModel
from localspec.drafting.draft_model import PROBE_ALPHA, WIN_MARGIN, model_can_win
from localspec.llama.model import Model
from localspec.paths import cache_dir

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
_FILLER = 220  # a common token; the cost of a decode does not depend on which tokens it holds
_PREFILL = 64  # tokens of the draft's measured catch-up batch
SIZE_MARGIN = 0.75  # a draft token costs at least this share of its file size against the target's, in target decodes


def model_key(path: Path, *, threads: int | None, gpu_layers: int, ctx: int) -> str:
    """The cache key of a model file loaded with these settings (a changed file is a new key)."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|t{threads}|g{gpu_layers}|c{ctx}"


def _key(model: Model) -> str:
    return model_key(model.path, threads=model.n_threads, gpu_layers=model.n_gpu_layers, ctx=model.n_ctx_asked)


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


def _store() -> dict[str, Any]:
    try:
        data = json.loads((cache_dir() / "costs.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def calibrated_verdict(target: Model, draft_key: str) -> bool | None:
    """Whether the draft model could win here when the pair was last measured afresh (None: not recorded)."""
    verdict = _store().get(_key(target), {}).get("calibrated_wins", {}).get(draft_key)
    return verdict if isinstance(verdict, bool) else None


def cached_costs(target_key: str, draft_key: str | None = None) -> CostModel | None:
    """The cached costs of a target (and a draft model next to it) by their keys; None when not measured yet."""
    entry = _store().get(target_key)
    if not entry or not entry.get("verify"):
        return None
    cost = CostModel({int(n): float(s) for n, s in entry["verify"].items()})
    if draft_key is not None:
        seconds = entry.get("draft", {}).get(draft_key)
        if not seconds:
            return None
        cost.draft = float(seconds)
        cost.draft_prefill = float(entry.get("draft_prefill", {}).get(draft_key, seconds))
    return cost


def target_costs(target: Model) -> CostModel:
    """The target's verify curve here: from the cache, else empty, to be learned from this run's own rounds
    (its first decode prices the next; a batch size is priced by a guess until a round has used it), so a first
    run spends no time measuring before it answers."""
    return cached_costs(_key(target)) or CostModel({})


def cached_draft_costs(target: Model, draft_key: str, cost: CostModel) -> bool:
    """Fill in the cached costs of the draft model `draft_key` next to `target`; False when none are cached."""
    cached = cached_costs(_key(target), draft_key)
    if cached is None:
        return False
    cost.draft, cost.draft_prefill = cached.draft, cached.draft_prefill
    cost.bound()
    return True


def load_costs(target: Model, draft: Model | None) -> CostModel:
    """The cost model of this pair here, measuring what the cache does not hold yet (for the bench)."""
    cost = cached_costs(_key(target))
    if cost is None:
        cost = _measure_target(target)
        save_costs(target, None, cost)
    if draft is not None and not cached_draft_costs(target, _key(draft), cost):
        measure_draft(draft, cost)
        save_costs(target, draft, cost, calibrated=True)
    return cost


def calibrate(target: Model, draft: Model | None) -> CostModel:
    """Measure the pair afresh now and keep that as its costs (`localspec doctor --recalibrate`)."""
    cost = _measure_target(target)
    if draft is not None:
        measure_draft(draft, cost)
    save_costs(target, draft, cost, calibrated=True)
    return cost


def size_bound(target_path: Path, draft_path: Path) -> float:
    """A draft token's least cost in target decodes, by file size: a decode reads every weight once, and a
    smaller model uses the machine about as well per byte (0.40 measured against 0.44 by size on a 2-core
    EPYC: hence the margin)."""
    return SIZE_MARGIN * draft_path.stat().st_size / target_path.stat().st_size


def by_size(target_path: Path, draft_path: Path, cost: CostModel) -> CostModel:
    """The target's costs with a draft token at its size bound (what a draft model not yet measured may cost)."""
    return CostModel(cost.curve(), draft=size_bound(target_path, draft_path) * cost.verify_cost(1))


def decide_draft(
    target: Model, draft_path: Path, draft_key: str, load_draft: Callable[[], Model], cost: CostModel
) -> tuple[CostModel, Model | None, list[str]]:
    """The one decision whether to use a draft model: (costs, the loaded draft or None, notes for the user).

    It is loaded only where its costs say it can beat the target alone here even at PROBE_ALPHA acceptance.
    A first run (no target costs yet) answers without it and learns the target's costs; later, a draft that
    cannot win even at the cost its size bounds it by is never loaded, and one that might is loaded once and
    measured with the target's whole curve. Where what was learned since disagrees with the verdict of the
    last fresh measurement (a busy hour once made a CPU's draft model look like a winner), or says it wins
    where no verdict was kept, both are measured afresh before the learned costs are trusted, and the notes
    say so.
    """
    name = draft_path.name
    if not cost.measured:
        return cost, None, [f"draft model {name} not loaded: this first run here learns the target's costs first"]
    draft, notes = None, []
    if not cached_draft_costs(target, draft_key, cost):
        if not model_can_win(by_size(target.path, draft_path, cost)):
            return cost, None, [f"draft model {name} {cannot_win(size_reason(target.path, draft_path))}"]
        draft = load_draft()
        cost = calibrate(target, draft)  # the whole curve too: a verdict kept from a partly learned one would drift
    elif model_can_win(cost) != (calibrated_verdict(target, draft_key) or False):  # no verdict kept: trust a loss
        draft = load_draft()
        learned = "a winner" if model_can_win(cost) else "a loser"
        cost = calibrate(target, draft)
        notes.append(
            f"the learned costs had drifted from this machine's last measurement (the draft model looked like "
            f"{learned}): measured afresh"
        )
    if model_can_win(cost):
        return cost, draft or load_draft(), notes
    notes.append(
        f"draft model {name} {cannot_win(f'a draft token costs {cost.draft_token / cost.verify_cost(1):.2f} target decodes')}"
    )
    return cost, None, notes


def size_reason(target_path: Path, draft_path: Path) -> str:
    return f"by its size a draft token costs at least {size_bound(target_path, draft_path):.2f} target decodes"


def cannot_win(why: str) -> str:
    """What is said of a draft model left out because it cannot win here."""
    return (
        f"not loaded: here it cannot beat the target alone by {WIN_MARGIN:.2f}x even at {PROBE_ALPHA:.0%} "
        f"acceptance ({why})"
    )


def save_costs(target: Model, draft: Model | None, cost: CostModel, *, calibrated: bool = False) -> None:
    """Keep the learned quiet costs for the next run (never the session's load); never fails the caller.

    `calibrated`: these costs were just measured afresh; their verdict on the draft model is kept too."""
    if not cost.measured:
        return
    store = _store()
    entry = store.setdefault(_key(target), {})
    entry["verify"] = {str(n): s for n, s in cost.curve().items() if n in CALIBRATION_SIZES or n <= 64}
    if draft is not None:
        entry.setdefault("draft", {})[_key(draft)] = cost.draft
        entry.setdefault("draft_prefill", {})[_key(draft)] = cost.draft_prefill
        if calibrated:
            entry.setdefault("calibrated_wins", {})[_key(draft)] = model_can_win(cost)
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        tmp = cache_dir() / "costs.json.tmp"
        tmp.write_text(json.dumps(store, indent=1))
        tmp.replace(cache_dir() / "costs.json")
    except OSError:
        pass
