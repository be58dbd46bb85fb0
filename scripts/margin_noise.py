"""The draft-model decision's noise: the margin a try of the draft model measures, over repeated tries.

    python scripts/margin_noise.py --target models/...-q8_0.gguf --runs 8 --out scripts/margin-trace.json

A first `localspec generate` learns the target's costs in an empty cache; then every run starts from a copy of
that cache with the decision set to try the draft model now, answers the prompt (the draft drafting its trial
rounds, then as the planner prices it), and settles: each run's margin (1.0: at the threshold) and seconds
are recorded, with their mean and spread. The recorded runs are the history tests/unit/test_decision.py replays.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPT = "Explain what a mutex is, with an example."


def generate(target: str, cache: Path, tokens: int) -> dict[str, object]:
    cmd = [sys.executable, "-m", "localspec", "generate", "--json", "--temperature", "0", "-n", str(tokens)]
    env = dict(os.environ, LOCALSPEC_CACHE_DIR=str(cache))
    out = subprocess.run([*cmd, "--target", target, PROMPT], env=env, capture_output=True, check=True)
    record: dict[str, object] = json.loads(out.stdout)
    return record


def decision(cache: Path) -> tuple[dict[str, object], dict[str, object]]:
    """(the target's entry, its one decision) in the cache."""
    entry = next(iter(json.loads((cache / "costs.json").read_text()).values()))
    return entry, next(iter(entry["decisions"].values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="localspec-noise-"))
    generate(args.target, base, args.max_tokens)  # learns the target's costs
    entry, kept = decision(base)
    kept.update(runs=99, wait=1, user_seconds=1e6, try_seconds=0.0, last_try=None)
    (base / "costs.json").write_text(json.dumps({next(iter(json.loads((base / "costs.json").read_text()))): entry}))
    runs = []
    for i in range(args.runs):
        cache = Path(tempfile.mkdtemp(prefix="localspec-noise-run-"))
        shutil.copy(base / "costs.json", cache / "costs.json")
        record = generate(args.target, cache, args.max_tokens)
        settled = decision(cache)[1]
        runs.append({"margin": settled["margin"], "seconds": record["total_seconds"], "try": settled["last_try"]})
        print(f"run {i + 1}: margin {settled['margin']:.3f}, {record['total_seconds']:.1f} s", flush=True)
    margins = [float(r["margin"]) for r in runs]  # type: ignore[arg-type]
    summary = {
        "mean": statistics.mean(margins),
        "sd": statistics.stdev(margins) if len(margins) > 1 else 0.0,
        "range": max(margins) - min(margins),
    }
    print(f"margin: mean {summary['mean']:.3f}, sd {summary['sd']:.3f}, range {summary['range']:.3f}")
    if args.out:
        about = (
            f"{args.runs} tries of the default draft model with target {Path(args.target).name}, {os.cpu_count()} cores"
        )
        args.out.write_text(json.dumps({"about": about, "summary": summary, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
