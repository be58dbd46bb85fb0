"""scripts/gpu_check.py on the CPU: everything of the device run but its CUDA build (random-weight twins,
calibration, the default against --no-draft, the replay against a given curve, the table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.llama.model import Model
from localspec.models.gguf import read_gguf

ROOT = Path(__file__).resolve().parents[2]
import gpu_check  # noqa: E402
from twin import header_of, write_twin  # noqa: E402


@pytest.mark.slow
def test_a_twin_has_the_models_shapes_and_generates(draft_path: Path, tmp_path: Path) -> None:
    """The header travels, the weights are random: same size, tensors and vocabulary; finite, varied logits."""
    header = header_of(draft_path)
    assert len(header) < 8 * 2**20
    twin = write_twin(header, tmp_path / "twin.gguf")
    real, made = read_gguf(draft_path), read_gguf(twin)
    assert twin.stat().st_size == draft_path.stat().st_size and made.tensors == real.tensors
    model = Model(twin, n_ctx=128)
    prompt, out = model.tokenize("def add(a, b):"), list[int]()
    for _ in range(6):
        logits = model.sync(prompt + out, 1)[0]
        assert np.isfinite(logits).all() and logits.std() > 0
        out.append(int(logits.argmax()))
    assert len(set(out)) > 1


@pytest.mark.slow
def test_the_device_run_works_on_a_cpu(draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --gpu-layers 0` with the draft's header as both twins (small): calibration, pairs, replay, table."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    gpu_check.write_headers(tmp_path / "bundle", draft_path, draft_path)
    result = gpu_check.run(tmp_path / "bundle", tmp_path / "out", gpu_layers=0, tokens=8, models=tmp_path)
    assert list(result["verify_ms"]) == [1, 2, 4, 8, 16, 32, 64] and result["draft_token"] > 0
    assert result["replay"] and all(x > 0 for x in result["replay"].values())
    beside = result["beside"]  # a model loads on its own thread while the target decodes: ready, and timed
    assert beside["load_seconds"] > 0 and beside["ms_alone"] > 0 and beside["ms_beside"] > 0, beside
    assert all(not r["same"].startswith("DIFFERENT") for r in result["runs"]), result["runs"]
    assert all(
        r["k4_sampled"]["ms_per_round"]["draft"] > 0 < r[w]["host_ms_per_token"]
        for r in result["runs"]
        for w in ("no_draft", "k4_sampled")
    )
    assert (tmp_path / "out" / "gpu-table.md").read_text().startswith("Device: no NVIDIA GPU (CPU)")
