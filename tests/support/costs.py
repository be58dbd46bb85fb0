"""The cost store as a run that measured a pair writes it."""

from __future__ import annotations

import json
from pathlib import Path

from localspec.decoding.loader import default_threads
from localspec.drafting import store
from localspec.drafting.costs import CostModel
from localspec.drafting.kept import DraftDecision
from localspec.drafting.prior import clear_win, promise

CPU_CURVE = {1: 0.036, 2: 0.060, 4: 0.095, 8: 0.19, 16: 0.26, 32: 0.43, 64: 0.80}  # batches cost ~k decodes
GPU_CURVE = {1: 0.010, 2: 0.010, 4: 0.011, 8: 0.011, 16: 0.012, 32: 0.014, 64: 0.020}  # nearly flat


def write_costs(
    cache: Path, target: Path, draft: Path | None, curve: dict[int, float], draft_token: float, ctx: int = 4096
) -> None:
    """A costs.json as a run that measured this pair writes it under the default settings (its decision just
    settled by its margin); without a draft, as a run that never measured one writes it."""
    settings = {"threads": default_threads(), "gpu_layers": 0, "ctx": ctx}
    entry: dict = {"verify": {str(n): s for n, s in curve.items()}}
    if draft is not None:
        dkey = store.key(draft, **settings)
        cost = CostModel(dict(curve), draft=draft_token, draft_prefill=draft_token / 8)
        entry |= {
            "draft": {dkey: draft_token},
            "draft_prefill": {dkey: draft_token / 8},
            "decisions": {dkey: DraftDecision(uses=clear_win(cost), margin=promise(cost)).to_json()},
        }
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "costs.json").write_text(json.dumps({store.key(target, **settings): entry}))
