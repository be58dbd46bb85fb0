"""scripts/gpu_check.py's report and replay, without a model or a GPU."""

from __future__ import annotations

from pathlib import Path

import gpu_check
from replay import replay
from support.costs import CPU_CURVE, GPU_CURVE

ROOT = Path(__file__).resolve().parents[2]


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
