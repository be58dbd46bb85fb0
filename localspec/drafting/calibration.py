"""Measuring this machine's decode costs (the planner's input), cached per model file and settings.

The cache (costs.json in the user's cache directory) keys the target's verify curve by its file and
settings, and each draft model's costs under it by the draft's, so whether a draft model can ever
win here is known before the draft is loaded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.drafting.costs import CostModel
from localspec.drafting.decision import Choice, DraftDecision
from localspec.drafting.draft_model import (
    PROBE_ALPHA,
    TRIAL_K,
    TRIAL_ROUNDS,
    WIN_MARGIN,
    DraftModelDrafter,
    margin,
    model_can_win,
)
from localspec.files import read_json, update_json
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


def _path() -> Path:
    return cache_dir() / "costs.json"


def _entry(store: dict[str, Any], target_key: str) -> dict[str, Any]:
    """A target's entry in the store; {} where it is missing or of the wrong shape."""
    entry = store.get(target_key)
    return entry if isinstance(entry, dict) else {}


def _positive(table: Any, key: str) -> float | None:
    """table[key] where it is a positive number (a kept time or ratio); None otherwise."""
    value = table.get(key) if isinstance(table, dict) else None
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
        else None
    )


def cached_costs(target_key: str, draft_key: str | None = None) -> CostModel | None:
    """The cached costs of a target (and a draft model next to it) by their keys; None when not measured yet
    (or kept in a shape this version cannot read)."""
    entry = _entry(read_json(_path()), target_key)
    table = entry.get("verify")
    curve = {int(n): s for n in table if n.isdigit() and (s := _positive(table, n))} if isinstance(table, dict) else {}
    if not curve:
        return None
    cost = CostModel(curve)
    if draft_key is not None:
        seconds = _positive(entry.get("draft"), draft_key)
        if seconds is None:
            return None
        cost.draft = seconds
        cost.draft_prefill = _positive(entry.get("draft_prefill"), draft_key) or seconds
    return cost


def kept_decision(target_key: str, draft_key: str) -> DraftDecision:
    """The kept decision of `target_key` on the draft model `draft_key` (a fresh one where none is kept)."""
    return _decision(_entry(read_json(_path()), target_key), draft_key)


def _decision(entry: dict[str, Any], draft_key: str) -> DraftDecision:
    decisions = entry.get("decisions")
    return DraftDecision.from_json(decisions.get(draft_key) if isinstance(decisions, dict) else None)


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
        save_costs(target, draft, cost)
    return cost


def calibrate(target: Model, draft: Model | None) -> CostModel:
    """Measure the pair afresh now and keep that as its costs (`localspec doctor --recalibrate`)."""
    cost = _measure_target(target)
    if draft is not None:
        measure_draft(draft, cost)
    save_costs(target, draft, cost)
    return cost


def size_bound(target_path: Path, draft_path: Path) -> float:
    """A draft token's least cost in target decodes, by file size: a decode reads every weight once, and a
    smaller model uses the machine about as well per byte (0.40 measured against 0.44 by size on a 2-core
    EPYC: hence the margin)."""
    return SIZE_MARGIN * draft_path.stat().st_size / target_path.stat().st_size


def by_size(target_path: Path, draft_path: Path, cost: CostModel) -> CostModel:
    """The best a draft model not measured yet may cost here: a draft token at its size bound, and batches
    larger than any measured no dearer than the largest measured (as a GPU's nearly flat curve)."""
    curve = cost.curve()
    curve.setdefault(CALIBRATION_SIZES[-1], max(curve.values()))
    return CostModel(curve, draft=size_bound(target_path, draft_path) * cost.verify_cost(1))


@dataclass
class DraftChoice:
    """What one run (or session) chose about a draft model; settled into the kept decision by save_costs.
    `agreement` and `load_estimate` are what runs before learned of it: its acceptance against the target's
    confidence (draft_model.Acceptance) and its load's seconds (at most the target's before it was measured)."""

    draft_key: str
    choice: Choice
    decision: DraftDecision
    load_seconds: float = 0.0  # the draft model's load, once it was loaded
    agreement: float = 1.0
    load_estimate: float = 0.0


def decide_draft(
    target: Model, draft_path: Path, draft_key: str, cost: CostModel, loaded_in: float
) -> tuple[list[str], DraftChoice]:
    """The one decision whether a run uses a draft model: (notes, the choice: "use", "try" or "skip").

    Nothing is measured for it: a first run here answers without it and learns the target's costs; a draft
    model that cannot win even at the cost its size bounds it by is never loaded; otherwise the kept
    DraftDecision says whether it is used, or tried in this answer (rarely, within its budget: priced at its
    size bound, its first decodes measure it). `loaded_in` is the target's load time (a bound on the draft
    model's, in a try's estimated cost). The caller loads the draft where the choice is not "skip", and adds
    the load's seconds to the choice.
    """
    entry = _entry(read_json(_path()), _key(target))
    name, decision = draft_path.name, _decision(entry, draft_key)
    kept = cost.measured and cached_draft_costs(target, draft_key, cost)
    if not cost.measured:
        choice: Choice = "skip"
        notes = [f"draft model {name} not loaded: this first run here learns the target's costs first"]
    elif not kept and not model_can_win(by_size(target.path, draft_path, cost)):
        choice, notes = "skip", [f"draft model {name} {cannot_win(size_reason(target.path, draft_path))}"]
    else:
        choice = decision.choice(try_estimate(size_bound(target.path, draft_path), cost, loaded_in))
        notes = []
        if choice == "skip":
            notes = [
                f"draft model {name} {cannot_win(draft_ratio(cost)) if kept else 'not loaded: not tried here yet'}"
            ]
        elif choice == "try":
            notes = [f"draft model {name} tried in this answer (its costs here are learned from its drafts)"]
    if choice != "skip" and (choice == "try" or not kept):  # priced at its size bound until its first decodes
        cost.guess_draft(size_bound(target.path, draft_path) * cost.verify_cost(1))
    agreement = _positive(entry.get("agreement"), draft_key) or 1.0
    load = _positive(entry.get("draft_load"), draft_key) or loaded_in
    return notes, DraftChoice(draft_key, choice, decision, agreement=agreement, load_estimate=load)


def try_estimate(draft_decodes: float, cost: CostModel, loaded_in: float) -> float:
    """What a first try of a draft model may cost here: its load (at most the target's, `loaded_in`) and its
    trial rounds, each TRIAL_K draft tokens (`draft_decodes` target decodes each) and a larger batch than the
    target alone's (priced by the curve, guessed high where not measured)."""
    one = cost.verify_cost(1)
    return loaded_in + TRIAL_ROUNDS * (TRIAL_K * draft_decodes * one + cost.verify_cost(TRIAL_K + 1) - one)


def draft_ratio(cost: CostModel) -> str:
    return f"a draft token costs {cost.draft_token / cost.verify_cost(1):.2f} target decodes"


def size_reason(target_path: Path, draft_path: Path) -> str:
    return f"by its size a draft token costs at least {size_bound(target_path, draft_path):.2f} target decodes"


def cannot_win(why: str) -> str:
    """What is said of a draft model left out because it cannot win here."""
    return (
        f"not loaded: here it cannot beat the target alone by {WIN_MARGIN:.2f}x even at {PROBE_ALPHA:.0%} "
        f"acceptance ({why})"
    )


def save_costs(
    target: Model,
    draft: Model | None,
    cost: CostModel,
    choice: DraftChoice | None = None,
    *,
    seconds: float = 0.0,
    drafter: DraftModelDrafter | None = None,
) -> None:
    """Keep the learned quiet costs for the next run (never the session's load), and settle `choice` into
    its kept decision: the user spent `seconds` on the session, and the draft model's rounds took what
    `drafter.realized` says against the target alone; keep what `drafter` learned of its acceptance, and the
    seconds its load took. Never fails the caller."""
    realized = drafter.realized if drafter is not None else None
    if not cost.measured and choice is None:
        return
    known = cost.draft > 0 and not cost.draft_guessed  # measured here, now or by a run before
    if choice is not None:
        loaded = choice.load_seconds > 0
        speedup = realized.speedup(choice.load_seconds) if realized is not None and loaded else None
        promised = margin(cost) if loaded and known and cost.measured else None  # no new evidence unless loaded
        lost = max(realized.seconds + choice.load_seconds - realized.alone, 0.0) if realized and loaded else 0.0
        choice.decision.settle(
            choice.choice if loaded else "skip",  # a use or try whose answer never reached the draft model
            margin=speedup if speedup is not None else promised,
            seconds=seconds,
            try_seconds=lost,
        )

    def change(store: dict[str, Any]) -> None:
        entry = store[_key(target)] = _entry(store, _key(target))
        if cost.measured:
            entry["verify"] = {str(n): s for n, s in cost.curve().items() if n in CALIBRATION_SIZES or n <= 64}
        if known and draft is not None:
            _keep(entry, _key(draft), {"draft": cost.draft, "draft_prefill": cost.draft_prefill})
        if choice is not None:
            kept: dict[str, Any] = {"decisions": choice.decision.to_json()}
            if drafter is not None and drafter.realized.rounds:
                kept["agreement"] = drafter.acceptance.agreement
            if choice.load_seconds > 0:
                kept["draft_load"] = choice.load_seconds
            _keep(entry, choice.draft_key, kept)

    update_json(_path(), change)


def _keep(entry: dict[str, Any], draft_key: str, values: dict[str, Any]) -> None:
    """Set each table's value for `draft_key` in a target's entry (a table of the wrong shape starts afresh)."""
    for table, value in values.items():
        if not isinstance(entry.get(table), dict):
            entry[table] = {}
        entry[table][draft_key] = value
