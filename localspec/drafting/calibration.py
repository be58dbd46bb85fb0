"""Measuring this machine's decode costs (the planner's input), and the store that keeps them.

The store (costs.json in the user's cache directory) keys the target's verify curve by its file and
settings, and what is kept of each draft model under it by the draft's (policy.Kept: its costs, agreement,
load and verdict), so whether a draft model can win here is known before the draft is loaded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from localspec.drafting.costs import CostModel
from localspec.drafting.draft_model import DraftModelDrafter
from localspec.drafting.policy import DraftPolicy, Kept, positive, size_bound
from localspec.files import read_json, update_json
from localspec.llama.model import Model
from localspec.paths import cache_dir

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
_FILLER = 220  # a common token; the cost of a decode does not depend on which tokens it holds
_PREFILL = 64  # tokens of the draft's measured catch-up batch
HOST_PARTS = ("round", "position", "draft")  # the host's seconds kept: CostModel.host_round, _position, _draft


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


def _path() -> Path:
    return cache_dir() / "costs.json"


def _entry(store: dict[str, Any], target_key: str) -> dict[str, Any]:
    """A target's entry in the store; {} where it is missing or of the wrong shape."""
    entry = store.get(target_key)
    return entry if isinstance(entry, dict) else {}


def cached_costs(target_key: str) -> CostModel | None:
    """The cached verify curve of a target by its key; None when not measured yet (or kept in a shape this
    version cannot read)."""
    entry = _entry(read_json(_path()), target_key)
    table, host = entry.get("verify"), entry.get("host")
    curve = (
        {int(n): s for n in table if n.isascii() and n.isdigit() and (s := positive(table, n))}
        if isinstance(table, dict)
        else {}
    )
    if not curve:
        return None
    cost = CostModel(curve)
    if isinstance(host, dict):  # the host's seconds as the last run left them
        cost.host_round, cost.host_position, cost.host_draft = (positive(host, n) or 0.0 for n in HOST_PARTS)
    return cost


def kept(target_key: str, draft_key: str) -> Kept:
    """What the store keeps of the draft model `draft_key` next to `target_key` (nothing kept: a fresh Kept)."""
    return Kept.from_entry(_entry(read_json(_path()), target_key), draft_key)


def target_costs(target: Model) -> CostModel:
    """The target's verify curve here: from the cache, else empty, to be learned from this run's own rounds
    (its prefill and first decode price the next; a batch size is priced by a guess until a round has used it),
    so a first run spends no time measuring before it answers."""
    return cached_costs(_key(target)) or CostModel({})


def _with_draft(cost: CostModel, target: Model, draft: Model) -> bool:
    """Fill in the kept costs of `draft` next to `target`; False where none are kept."""
    k = kept(_key(target), _key(draft))
    if k.measured:
        k.price(cost)
    return k.measured


def load_costs(target: Model, draft: Model | None) -> CostModel:
    """The cost model of this pair here, measuring what the cache does not hold yet (for the bench)."""
    cost = cached_costs(_key(target))
    if cost is None:
        cost = _measure_target(target)
        save_costs(target, None, cost)
    if draft is not None and not _with_draft(cost, target, draft):
        measure_draft(draft, cost)
        save_costs(target, draft, cost)
    return cost


def calibrate(target: Model, draft: Model | None) -> CostModel:
    """Measure the pair afresh now and keep that as its costs (`localspec doctor --recalibrate`)."""
    cost = _measure_target(target)
    if draft is not None:
        measure_draft(draft, cost)
    save_costs(target, draft, cost)
    return cost


def file_bound(target_path: Path, draft_path: Path) -> float:
    """The size bound of a pair's files (policy.size_bound)."""
    return size_bound(target_path.stat().st_size, draft_path.stat().st_size)


def decide_draft(
    target: Model, draft_path: Path, draft_key: str, cost: CostModel, loaded_in: float, *, named: bool
) -> DraftPolicy:
    """The session's policy on the draft model at `draft_path` (policy.DraftPolicy.decide on what is kept here);
    `loaded_in` is the target's load time, `named` whether the user chose this draft model."""
    return DraftPolicy.decide(
        draft_key,
        draft_path.name,
        kept(_key(target), draft_key),
        cost,
        bound=file_bound(target.path, draft_path),
        loaded_in=loaded_in,
        named=named,
    )


def save_costs(
    target: Model,
    draft: Model | None,
    cost: CostModel,
    policy: DraftPolicy | None = None,
    *,
    seconds: float = 0.0,
    drafter: DraftModelDrafter | None = None,
) -> None:
    """Keep the learned quiet costs for the next run (never the session's load), and settle `policy` (the user
    spent `seconds` on the session; `drafter` drafted for it). Never fails the caller."""
    if not cost.measured and policy is None:
        return
    known = cost.draft > 0 and not cost.draft_guessed
    settled = None
    if policy is not None:  # settled once: the session's figures are the drafter's
        realized = drafter.realized if drafter is not None else None
        agreement = drafter.acceptance.learned if drafter is not None else None
        answers = drafter.answer_lengths if drafter is not None else []
        settled = policy.settle(cost, realized, agreement, seconds, answers)

    def change(store: dict[str, Any]) -> None:
        entry = store[_key(target)] = _entry(store, _key(target))
        if cost.measured:
            entry["verify"] = {str(n): s for n, s in cost.curve().items() if n in CALIBRATION_SIZES or n <= 64}
        if cost.host_round:
            entry["host"] = dict(zip(HOST_PARTS, (cost.host_round, cost.host_position, cost.host_draft), strict=True))
        if settled is not None and policy is not None:
            settled.into(entry, policy.draft_key)
        elif known and draft is not None:  # the bench's measured draft model
            measured = Kept.from_entry(entry, _key(draft))
            measured.draft, measured.draft_prefill = cost.draft, cost.draft_prefill
            measured.into(entry, _key(draft))

    update_json(_path(), change)
