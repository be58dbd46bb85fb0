"""A new user's first runs: the default from a fresh cost cache, run after run, against --no-draft and fixed k.

    python scripts/first_runs.py --target models/qwen2.5-coder-1.5b-instruct-q8_0.gguf --runs 4

Run i of the default uses the cache runs 1..i-1 taught (a new machine, then a user's history; the files warm
in the page cache first); each is paired
with a --no-draft process (the order alternating, so a machine whose speed drifts slows both alike), and the
best of `--k 2/3/4` with the draft model is timed `--fixed-pairs` times beside --no-draft. Prints one row per run:
its seconds, its ratio to its --no-draft pair, whether the draft model loaded, and the best fixed k's ratio.
`--also FLAGS` times a third way in each run, with a fresh cache of its own (`--also "--draft copier"`: the
default without a draft model).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from pairs import fresh_cache, run

PROMPT = "Write a Python class PriorityQueue with push, pop and peek methods, using heapq."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("-n", "--max-tokens", type=int, default=160)
    parser.add_argument("--fixed-pairs", type=int, default=1)
    parser.add_argument(
        "--also", default="", help="a third way's flags, in its own fresh cache (e.g. '--draft copier')"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    common = ["--target", args.target, "--temperature", "0"]
    cache, also_cache = fresh_cache(), fresh_cache()
    run([*common, "--no-draft"], args.prompt, 8, 1)  # the model files into the page cache: no run pays a cold read
    rows: list[dict[str, Any]] = []
    for i in range(args.runs):
        ways = [("default", common, cache), ("alone", [*common, "--no-draft"], None)]
        if args.also:
            ways.append(("also", [*common, *args.also.split()], also_cache))
        timed = {
            name: run(flags, args.prompt, args.max_tokens, 1, where) for name, flags, where in ways[:: 1 - 2 * (i % 2)]
        }
        row = {"run": i + 1, **timed, "ratio": timed["alone"]["wall"] / timed["default"]["wall"]}
        if args.also:
            row["also_ratio"] = timed["alone"]["wall"] / timed["also"]["wall"]
            print(f"run {i + 1}: {args.also}: {row['also_ratio']:.3f}x", flush=True)
        rows.append(row)
        print(
            f"run {i + 1}: default {timed['default']['wall']:.2f} s, --no-draft {timed['alone']['wall']:.2f} s: "
            f"{row['ratio']:.3f}x (draft model {'loaded' if timed['default']['draft_loaded'] else 'not loaded'})",
            flush=True,
        )
    fixed: dict[int, float] = {}
    for k in (2, 3, 4):
        ratios = []
        for p in range(args.fixed_pairs):
            pair = [("k", [*common, "--k", str(k)]), ("alone", [*common, "--no-draft"])]
            timed = {
                name: run(flags, args.prompt, args.max_tokens, 1, fresh_cache())
                for name, flags in pair[:: 1 - 2 * (p % 2)]
            }
            ratios.append(timed["alone"]["wall"] / timed["k"]["wall"])
        fixed[k] = statistics.median(ratios)
        print(f"--k {k}: {fixed[k]:.3f}x of --no-draft", flush=True)
    best = max(fixed.values())
    later = statistics.median(r["ratio"] for r in rows[1:]) if len(rows) > 1 else None
    print(f"run 1: {rows[0]['ratio']:.3f}x; runs 2+: median {later and f'{later:.3f}'}x; best fixed k: {best:.3f}x")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "fixed": fixed}, indent=1))


if __name__ == "__main__":
    main()
