"""scripts/gpu_check.py on the CPU: everything of the device run but its CUDA build (random-weight twins,
calibration, the default against --no-draft, the replay against a given curve, the table)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from localspec.llama.model import Model
from localspec.models.gguf import read_gguf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402
from replay import replay  # noqa: E402
from twin import header_of, write_twin  # noqa: E402

CPU_CURVE = {1: 0.036, 2: 0.060, 4: 0.095, 8: 0.19, 16: 0.26, 32: 0.43, 64: 0.80}
GPU_CURVE = {1: 0.010, 2: 0.010, 4: 0.011, 8: 0.011, 16: 0.012, 32: 0.014, 64: 0.020}


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


def test_the_replay_takes_a_given_curve(tmp_path: Path) -> None:
    """Where a batch costs about one decode (a GPU), the same copies verify in wider batches for more."""
    answers = ROOT / "scripts" / "replay-answers.json"
    speedups = {}
    for name, curve in (("cpu", CPU_CURVE), ("gpu", GPU_CURVE)):
        path = tmp_path / f"{name}.json"
        path.write_text(gpu_check.json.dumps({str(n): s for n, s in curve.items()}))
        rows = replay(answers, path)
        speedups[name] = sum(float(r["plain_seconds"]) for r in rows) / sum(float(r["seconds"]) for r in rows)
    assert speedups["gpu"] > speedups["cpu"] > 1.0


def test_the_table_has_every_figure() -> None:
    result = {
        "device": "NVIDIA GPU, 81559 MiB, 9.0",
        "backends": ["CUDA", "CPU"],
        "verify_ms": {n: s * 1e3 for n, s in GPU_CURVE.items()},
        "draft_token": 0.55,
        "draft_prefill_token": 0.02,
        "model_can_win": True,
        "draft_model_predicted": {"0.60": 1.2, "0.80": 1.7, "0.90": 2.1},
        "replay": {"edit-code": 2.5, "open-chat": 1.0},
        "beside": {"load_seconds": 0.4, "ready_at_token": 70, "ms_alone": 6.0, "ms_beside": 6.6, "slowdown": 1.1},
        "runs": [
            {
                "prompt": "Write a Python function that merges two sorted lists.",
                "speedup": 0.98,
                "same": "equal",
                **{
                    way: {"ms_per_round": {"target": 6.0, "draft": d, "host": 0.2}, "host_ms_per_token": 0.1}
                    for way, d in (("no_draft", 0.0), ("default", 1.5), ("k4_sampled", 2.4))
                },
            }
        ],
    }
    text = gpu_check.table(result)
    assert (
        "10.0 / 10.0 / 11.0 / 11.0 / 12.0 / 14.0 / 20.0" in text
        and "| draft model can win (at 90% acceptance) | yes |" in text
    )
    assert "edit-code | 2.50 |" in text and "0.98 (equal)" in text and text.count("\n| ") == 15
    assert "| 0.40 / 70 / 6.0 / 6.6 (1.10×) |" in text
    assert (
        "ms a round, target / draft / host, k4_sampled: Write a Python function that merges two  | 6.00 / 2.40 / 0.20"
        in text
    )


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
