"""The copier replayed on recorded greedy answers (scripts/replay.py): pure computation, no model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _replay_module():
    spec = importlib.util.spec_from_file_location("replay", ROOT / "scripts" / "replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replay_estimates_hold_on_the_recorded_curve() -> None:
    """Copies of code are verified wide and pay; text the prompt does not contain is not gambled on.

    A regression guard for the copier and the planner (estimated decode speedups on this machine's
    recorded verify curve, not timings): each bound sits about 10% under the value when it was set.
    """
    results = {r["task"]: r for r in _replay_module().replay(ROOT / "scripts" / "replay-answers.json")}
    speedup = {task: r["plain_seconds"] / r["seconds"] for task, r in results.items()}
    assert speedup["edit-bugfix"] > 2.2 and speedup["edit-rename"] > 1.85 and speedup["edit-code"] > 1.8
    assert speedup["summarize"] > 1.3
    assert all(speedup[task] > 0.95 for task in ("chat", "chat-2", "short-haiku", "short-fact", "write-code"))
    assert all(r["accepted"] <= r["drafted"] for r in results.values())
