"""The cost store: what runs here learned of the machine, kept between them (costs.json in the cache directory).

A target's entry, under its key (`key`: its file and the settings it was loaded with), holds its verify curve, the
host's seconds outside llama_decode, and what is kept of each draft model beside it under the draft's key
(kept.Kept: its costs, agreement, load, answers and verdict). Keys are made here and nowhere else, so `doctor`,
`generate`, `serve` and the bench read one entry for the same settings. Calibration measures; this keeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.drafting.costs import CostModel
from localspec.drafting.kept import Kept, positive
from localspec.drafting.policy import DraftPolicy
from localspec.drafting.prior import size_bound
from localspec.files import read_json, update_json
from localspec.paths import cache_dir

if TYPE_CHECKING:
    from localspec.llama.model import Model

KEPT_ROWS = 64  # the largest batch whose cost is kept
HOST_PARTS = ("round", "position", "draft")  # the host's seconds kept: CostModel.host_round, _position, _draft


def key(path: Path, *, threads: int | None, gpu_layers: int, ctx: int) -> str:
    """The store's key of a model file loaded with these settings (a changed file is a new key)."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|t{threads}|g{gpu_layers}|c{ctx}"


def model_key(model: Model) -> str:
    """The key of a loaded model (`key` of its file and the settings it was loaded with)."""
    return key(model.path, threads=model.n_threads, gpu_layers=model.n_gpu_layers, ctx=model.n_ctx_asked)


def _path() -> Path:
    return cache_dir() / "costs.json"


def _entry(store: dict[str, Any], target_key: str) -> dict[str, Any]:
    """A target's entry in the store; {} where it is missing or of the wrong shape."""
    entry = store.get(target_key)
    return entry if isinstance(entry, dict) else {}


def costs(target_key: str) -> CostModel | None:
    """The kept verify curve (and host seconds) of a target; None when not measured yet (or kept in a shape this
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
    """What the store keeps of the draft model `draft_key` beside `target_key` (nothing kept: a fresh Kept)."""
    return Kept.from_entry(_entry(read_json(_path()), target_key), draft_key)


def file_bound(target_path: Path, draft_path: Path) -> float:
    """The size bound of a pair's files (prior.size_bound)."""
    return size_bound(target_path.stat().st_size, draft_path.stat().st_size)


def decide(
    keys: tuple[str, str],
    paths: tuple[Path, Path],
    cost: CostModel,
    loaded_in: float,
    *,
    named: bool,
    session: bool = False,
) -> DraftPolicy:
    """The session's policy on the draft model (`keys` and `paths`: the target's and the draft's), decided on what
    is kept here (policy.DraftPolicy.decide); `loaded_in` is the target's load time, `named` whether the user chose
    this draft model, `session` whether it gives many answers (a chat, a server)."""
    bound = file_bound(*paths)
    return DraftPolicy.decide(
        keys[1], paths[1].name, kept(*keys), cost, bound=bound, loaded_in=loaded_in, named=named, session=session
    )


def keep(target_key: str, cost: CostModel, draft: tuple[str, Kept] | None = None) -> None:
    """Keep a target's learned quiet costs (its curve where measured, the host's seconds) and, where given, what is
    known of a draft model (its key and Kept). Never fails the caller."""
    if not cost.measured and draft is None:
        return

    def change(store: dict[str, Any]) -> None:
        entry = store[target_key] = _entry(store, target_key)
        if cost.measured:
            entry["verify"] = {str(n): s for n, s in cost.curve().items() if n <= KEPT_ROWS}
        if cost.host_round:
            entry["host"] = dict(zip(HOST_PARTS, (cost.host_round, cost.host_position, cost.host_draft), strict=True))
        if draft is not None:
            draft[1].into(entry, draft[0])

    update_json(_path(), change)


def settle(target_key: str, cost: CostModel, policy: DraftPolicy | None, seconds: float) -> None:
    """Keep a session's learned costs and settle its draft-model `policy` on its evidence (the user spent `seconds`
    on the session): what a session does once, as it ends."""
    keep(target_key, cost, (policy.draft_key, policy.settle(cost, seconds)) if policy is not None else None)
