"""Whole-process wall time, time to first token and peak RSS of `localspec generate`, two ways, in interleaved pairs.

    python scripts/pairs.py --pairs 4 --prompt "Explain what a mutex is." -- "" "--no-draft"
    python scripts/pairs.py --pairs 6 --fresh --prompt "Q1" --prompt "Q2" ... -- "--no-recall --cache-disk 0" "--no-draft"

Each way is a separate argument string of extra flags ("" is the default). With several `--prompt`s pair i asks
the i-th (cycling): both ways of a pair the same question, each pair a new one, so that no run drafts from an
earlier answer to the same question. The ways alternate (A B, B A,
A B, ...), so a machine whose speed drifts slows both alike; the verdict is the median of the per-pair ratios.
Peak RSS is each child process's own (wait4). `--fresh` gives every run an empty cache directory: each is the
first run on a new machine (no measured costs).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any


def run(flags: Sequence[str], prompt: str, max_tokens: int, seed: int, cache: str | None = None) -> dict[str, Any]:
    """One whole `localspec generate --json` process with extra `flags` (in its own cost cache where `cache` is
    given): its wall time, time to first token, peak RSS (wait4), tokens and whether a draft model was loaded."""
    cmd = [sys.executable, "-m", "localspec", "generate", "--json", "-n", str(max_tokens), "--seed", str(seed)]
    env = dict(os.environ, LOCALSPEC_CACHE_DIR=cache) if cache else None
    t0 = time.perf_counter()
    proc = subprocess.Popen([*cmd, *flags, prompt], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"localspec generate {' '.join(flags)} failed ({status})")
    record = json.loads(out)
    return {
        "wall": wall,
        "ttft": record["time_to_first_token"],
        "rss_mb": usage.ru_maxrss / 1024,
        "tokens": record["completion_tokens"],
        "draft_loaded": record["draft"] is not None,
        "joined": record.get("first_drafts", {}).get("draft_model"),
    }


def fresh_cache() -> str:
    """An empty cost cache: a run in it is the first on a new machine."""
    return tempfile.mkdtemp(prefix="localspec-fresh-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--prompt", action="append", required=True, help="a question (repeat: one a pair, cycling)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="every run without measured costs (a first run)")
    parser.add_argument("ways", nargs=2, help="extra flags of way A and way B ('' for the default)")
    args = parser.parse_args()
    a, b = args.ways
    ratios: dict[str, list[float]] = {"wall": [], "ttft": []}
    rows = []
    for i in range(args.pairs):
        order = (a, b) if i % 2 == 0 else (b, a)
        got = {
            flags: run(
                shlex.split(flags),
                args.prompt[i % len(args.prompt)],
                args.max_tokens,
                args.seed,
                fresh_cache() if args.fresh else None,
            )
            for flags in order
        }
        for key in ratios:
            ratios[key].append(got[b][key] / got[a][key])  # > 1: way A is faster
        rows.append(got)
        print(
            f"pair {i + 1}: "
            + " | ".join(
                f"{f or 'default'}: {g['wall']:.2f} s, first token {g['ttft']:.2f} s, "
                f"{g['rss_mb']:.0f} MB, {g['tokens']} tokens, draft loaded {g['draft_loaded']}"
                + (f" (drafting from token {g['joined']})" if g["joined"] is not None else "")
                for f, g in got.items()
            ),
            flush=True,
        )
    print(
        f"median speedup of '{a or 'default'}' over '{b or 'default'}': whole process "
        f"{statistics.median(ratios['wall']):.3f}x, first token {statistics.median(ratios['ttft']):.3f}x; "
        f"peak RSS {statistics.median(r[a]['rss_mb'] for r in rows):.0f} MB vs "
        f"{statistics.median(r[b]['rss_mb'] for r in rows):.0f} MB"
    )


if __name__ == "__main__":
    main()
