"""The regression matrix: the default against --no-draft, whole process, over targets x prompts x histories.

    python scripts/matrix.py --out matrix              # all of it: 3 targets x 4 prompts x 3 histories x 3 pairs
    python scripts/matrix.py --targets q8_0 --prompts edit,open --pairs 3 -n 96 --out matrix
    python scripts/matrix.py --targets q4_k_m --prompts edit --histories warm --flags=--exact --out exact

Targets: the default pair's target (Q4_K_M) and the same model requantized to Q8_0 and F16 beside it (made once,
no download). Prompts: a code edit (a module renamed), an open prompt, a short prompt, a JSON answer under a
schema. Histories, each for `localspec generate`'s own cost cache:
- fresh: every run, either way, in an empty cache (a first run on a new machine);
- warm: a cache that `--warm` default runs of the target have taught first (a user's history);
- busy: that warm cache after `--busy` more default runs beside two busy loops (a busy hour), measured quietly.
Each cell is `--pairs` interleaved pairs (A B, B A, ...) of whole `localspec generate` processes; its verdict
is the median of the pairs' ratios (> 1: the default is faster). Writes OUT.json, OUT.md (the table) and
OUT.png (the ratios), and prints each cell as it ends.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pairs import fresh_cache, run

from localspec.frontends.bench import requantized
from localspec.frontends.bench_prompts import BUILTIN_PROMPTS, CUSTOMER_SCHEMA, STRUCTURED_PROMPT
from localspec.models.catalog import default_pair, resolve

PROMPTS = {
    "edit": next(p["prompt"] for p in BUILTIN_PROMPTS if p["task"] == "edit-rename"),
    "open": next(p["prompt"] for p in BUILTIN_PROMPTS if p["task"] == "chat"),
    "short": next(p["prompt"] for p in BUILTIN_PROMPTS if p["task"] == "short-fact"),
    "json": STRUCTURED_PROMPT["prompt"],
}
HISTORIES = ("fresh", "warm", "busy")


def target_file(quant: str) -> Path:
    """The default target, or it requantized to `quant` beside it (made once, as `localspec bench --requantize`)."""
    return resolve(default_pair()[0].name) if quant == "q4_k_m" else requantized(None, quant.upper())


def generate(target: Path, prompt: str, flags: list[str], cache: Path | str, tokens: int) -> dict[str, Any]:
    """One whole `localspec generate` process of `target` in the cost cache `cache` (pairs.run)."""
    return run(["--target", str(target), *flags], prompt, tokens, 1, str(cache))


def busy_loops() -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="q4_k_m,q8_0,f16")
    parser.add_argument("--prompts", default=",".join(PROMPTS))
    parser.add_argument("--histories", default=",".join(HISTORIES))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("-n", "--max-tokens", type=int, default=160)
    parser.add_argument("--warm", type=int, default=8, help="default runs that teach the warm cache")
    parser.add_argument("--busy", type=int, default=3, help="default runs beside two busy loops after warm")
    parser.add_argument("--out", type=Path, default=Path("matrix"))
    parser.add_argument("--flags", default="", help="more options for both sides, e.g. --flags=--exact")
    args = parser.parse_args()
    schema = Path(tempfile.mkdtemp(prefix="localspec-matrix-")) / "schema.json"
    schema.write_text(json.dumps(CUSTOMER_SCHEMA))
    extra = {name: args.flags.split() for name in PROMPTS}
    extra["json"] += ["--temperature", "0", "--json-schema", str(schema)]
    cells: list[dict[str, Any]] = []
    for quant in args.targets.split(","):
        target = target_file(quant)
        warm = Path(tempfile.mkdtemp(prefix=f"localspec-warm-{quant}-"))
        names = args.prompts.split(",")
        for i in range(args.warm if {"warm", "busy"} & set(args.histories.split(",")) else 0):
            name = names[i % len(names)]
            generate(target, PROMPTS[name], extra.get(name, []), warm, args.max_tokens)
        for history in args.histories.split(","):
            cache = warm
            if history == "busy":
                cache = Path(tempfile.mkdtemp(prefix=f"localspec-busy-{quant}-"))
                shutil.copy(warm / "costs.json", cache / "costs.json")
                loops = busy_loops()
                try:
                    for i in range(args.busy):
                        name = names[i % len(names)]
                        generate(target, PROMPTS[name], extra.get(name, []), cache, args.max_tokens)
                finally:
                    for p in loops:
                        p.kill()
            for name in names:
                cells.append(_cell(target, quant, name, history, cache, extra.get(name, []), args))
        args.out.with_suffix(".json").write_text(json.dumps(cells, indent=1))
    write_table(cells, args.out.with_suffix(".md"))
    write_plot(cells, args.out.with_suffix(".png"))


def _cell(
    target: Path, quant: str, name: str, history: str, cache: Path, flags: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """One prompt's interleaved pairs under one history: the medians, printed as they come."""
    rows = []
    for i in range(args.pairs):
        got = {}
        for way in ("default", "no-draft") if i % 2 == 0 else ("no-draft", "default"):
            run_cache = fresh_cache() if history == "fresh" else cache
            got[way] = generate(
                target, PROMPTS[name], flags + (["--no-draft"] if way == "no-draft" else []), run_cache, args.max_tokens
            )
        rows.append(got)
    cell = {
        "target": quant,
        "prompt": name,
        "history": history,
        "ratio": statistics.median(r["no-draft"]["wall"] / r["default"]["wall"] for r in rows),
        "ttft_ratio": statistics.median(r["no-draft"]["ttft"] / r["default"]["ttft"] for r in rows),
        "rss_delta_mb": statistics.median(r["default"]["rss_mb"] - r["no-draft"]["rss_mb"] for r in rows),
        "draft_loaded": sum(r["default"]["draft_loaded"] for r in rows),
        "pairs": rows,
    }
    print(
        f"{quant:7} {name:6} {history:6} whole {cell['ratio']:.3f}x  first token {cell['ttft_ratio']:.3f}x  "
        f"RSS {cell['rss_delta_mb']:+.0f} MB  draft loaded {cell['draft_loaded']}/{args.pairs}  "
        f"default {statistics.median(r['default']['wall'] for r in rows):.1f} s",
        flush=True,
    )
    return cell


def write_table(cells: list[dict[str, Any]], path: Path) -> None:
    lines = [
        "| target | prompt | history | whole process | first token | RSS Δ | draft loaded |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        lines.append(
            f"| {c['target']} | {c['prompt']} | {c['history']} | {c['ratio']:.2f}× | {c['ttft_ratio']:.2f}× | "
            f"{c['rss_delta_mb']:+.0f} MB | {c['draft_loaded']}/{len(c['pairs'])} |"
        )
    path.write_text("\n".join(lines) + "\n")


def write_plot(cells: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{c['target']} {c['prompt']} {c['history']}" for c in cells]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(cells) + 1))
    ax.barh(
        labels, [c["ratio"] for c in cells], color=["tab:green" if c["ratio"] >= 0.97 else "tab:red" for c in cells]
    )
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(0.97, color="grey", linestyle="--", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("default over --no-draft, whole process (median of pairs; > 1: faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
