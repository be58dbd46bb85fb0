"""The host's time per token and per round (outside both models' llama_decode) of `localspec generate`, by case.

    python scripts/host_time.py                        # this checkout, the default pair, 3 runs a case
    python scripts/host_time.py --tree /path/to/other  # another checkout of localspec, for a before/after table
    python scripts/host_time.py --whole 8 --target models/gemma-3-270m-q4_k_m.gguf --flags=--raw
                                                       # whole processes against llama-cpp-python's own loop

Each case is a whole `localspec generate --json` process with a 160-token code answer; host time is
wall_seconds - target_seconds - draft_seconds of its record (the decode only: no load, no prefill). The cases
alternate run by run, and each figure is the median of --runs. `--plain` adds llama-cpp-python's own loop
(Llama.generate with the same sampler), its time outside llama_decode measured the same way.

On a CPU every decode streams the weights through the caches, so the host's first steps after it run cold
(a numpy call of three elements takes 50 us after a cache flush here): the host time measured so is the CPU's.
`--replay` measures it as a GPU's host would see it, its caches warm: each case runs twice in one process, the
second time with the models' decodes replaced by the logits the first run recorded (the same text, token for
token; decode time 0), so all of its time is the host's. The default case is left out there: its choices follow
the costs its first run learned, and would ask for decodes the first never made.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a Python class LRUCache with get and put, type hints and docstrings."
CASES = {  # name: (what it is, extra flags)
    "greedy": ("--no-draft, greedy", ["--no-draft", "--temperature", "0"]),
    "sampled": ("--no-draft, default sampler", ["--no-draft"]),
    "topk0": ("--no-draft --top-k 0", ["--no-draft", "--top-k", "0"]),
    "k4": ("--k 4 --no-copier (the draft model), default sampler", ["--k", "4", "--no-copier"]),
    "default": ("default, default sampler", []),
}


def generate(tree: Path, flags: list[str], tokens: int, target: str | None, extra: list[str]) -> dict[str, Any]:
    """One `localspec generate --json` process of the checkout at `tree`: its record."""
    cmd = [sys.executable, "-m", "localspec", "generate", "--json", "-n", str(tokens), "--seed", "1", *flags, *extra]
    if target:
        cmd += ["--target", target]
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([*cmd, PROMPT], capture_output=True, env=env, cwd=tree, text=True)
    if proc.returncode:
        raise SystemExit(f"localspec generate {' '.join(flags)} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def plain(target: str, tokens: int) -> dict[str, float]:
    """llama-cpp-python's own sampling loop with the default sampler: ms per token outside llama_decode."""
    import llama_cpp
    import llama_cpp._internals as internals

    low = llama_cpp.llama_cpp
    decode, spent = low.llama_decode, [0.0]

    def timed(ctx: Any, batch: Any) -> int:
        t0 = time.perf_counter()
        try:
            return decode(ctx, batch)
        finally:
            spent[0] += time.perf_counter() - t0

    internals.llama_cpp.llama_decode = timed
    llm = llama_cpp.Llama(target, n_ctx=4096, verbose=False)
    messages = [{"role": "user", "content": PROMPT}]
    prompt = llm.tokenize(
        f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n".encode(), special=True
    )
    t0, n = 0.0, 0
    for tok in llm.generate(prompt, temp=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0):
        if n == 0:  # the prefill is behind: the decode's time starts here
            spent[0], t0 = 0.0, time.perf_counter()
        n += 1
        if n > tokens or llm.token_eos() == tok:
            break
    wall = time.perf_counter() - t0
    return {"host_ms_per_token": (wall - spent[0]) * 1e3 / (n - 1), "tokens": n - 1}


QUESTIONS = [  # --whole: a new question each pair (nothing a cache kept answers it)
    "Write a Rust function that parses a CSV line.",
    "Explain how a B-tree works, with an example.",
    "Write a bash script that renames all .txt files to .md.",
    "Write a Go HTTP server with two routes.",
    "Write a SQL query for the top 5 customers by revenue.",
    "Write a C function that reverses a linked list.",
    "Write a Python decorator that retries a function three times.",
    "Write a TypeScript type for a JSON API response with pagination.",
]
PLAIN_PROCESS = """
import sys, llama_cpp
path, prompt, seed, tokens, raw = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
llm = llama_cpp.Llama(path, n_ctx=4096, verbose=False, seed=seed)
text = prompt if raw else f"<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n"
n = 0
for tok in llm.generate(llm.tokenize(text.encode(), special=not raw), temp=0.8, top_k=40, top_p=0.95, min_p=0.05,
                        repeat_penalty=1.0):
    if llm.token_eos() == tok or n == tokens:
        break
    sys.stdout.write(llm.detokenize([tok]).decode("utf-8", "replace"))
    n += 1
print(n, file=sys.stderr)
"""


def whole(target: str, flags: list[str], tokens: int, pairs: int) -> None:
    """Whole processes, interleaved: `localspec generate --no-draft` against llama-cpp-python's own loop (its
    load, its sampler, the same sampler settings), each pair a new question; the ratio is the plain one's time
    over localspec's (above 1: localspec is faster)."""
    ratios = []
    print("| pair | localspec s (tokens) | llama-cpp-python s (tokens) | ratio |")
    print("|---|---|---|---|")
    for i in range(pairs):
        question = QUESTIONS[i % len(QUESTIONS)]
        ours = [
            sys.executable,
            "-m",
            "localspec",
            "generate",
            "--json",
            "--no-draft",
            "--no-recall",
            "--cache-disk",
            "0",
        ]
        ours += ["-n", str(tokens), "--seed", str(i), "--target", target, *flags, question]
        theirs = [
            sys.executable,
            "-c",
            PLAIN_PROCESS,
            target,
            question,
            str(i),
            str(tokens),
            "1" if "--raw" in flags else "0",
        ]
        times, done = [], []
        for cmd in (ours, theirs):
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, check=True, cwd=ROOT, text=True)
            times.append(time.perf_counter() - t0)
            done.append(json.loads(proc.stdout)["completion_tokens"] if cmd is ours else int(proc.stderr.split()[-1]))
        if min(done) == tokens:  # both answered at full length (an answer ended early times less)
            ratios.append(times[1] / times[0])
        print(f"| {i + 1} | {times[0]:.2f} ({done[0]}) | {times[1]:.2f} ({done[1]}) | {times[1] / times[0]:.3f} |")
    print(
        f"\nmedian ratio {statistics.median(ratios):.3f} over the {len(ratios)} of {pairs} pairs both at {tokens} tokens"
    )


def replay(case: str, tokens: int, target: str | None) -> dict[str, float]:
    """The case run once on the models, then again with their decodes replayed from what the first recorded:
    the host's ms per token and per round with warm caches."""
    import numpy as np

    from localspec import LocalSpec
    from localspec.llama import model as llama_model

    flags = CASES[case][1]
    options: dict[str, Any] = {"no_draft": "--no-draft" in flags, "copier": "--no-copier" not in flags}
    if "--k" in flags:
        options["k"] = int(flags[flags.index("--k") + 1])
    sampler: dict[str, Any] = {"temperature": 0.0} if "--temperature" in flags else {}
    if "--top-k" in flags:
        sampler["top_k"] = int(flags[flags.index("--top-k") + 1])
    spec = LocalSpec.load(target, **options)
    real, recorded = llama_model.Model._decode, {}

    def record(self: Any, new: list[int], n_logits: int, skip: Any = ()) -> np.ndarray:
        rows = real(self, new, n_logits, skip)
        recorded[(self.path, tuple(self.tokens), n_logits, tuple(skip))] = rows.copy()
        return rows

    def replayed(self: Any, new: list[int], n_logits: int, skip: Any = ()) -> np.ndarray:
        self.tokens.extend(new)
        self.n_decoded += len(new)
        return recorded[(self.path, tuple(self.tokens), n_logits, tuple(skip))]

    llama_model.Model._decode = record  # type: ignore[method-assign]
    first = spec.generate(PROMPT, max_tokens=tokens, seed=1, **sampler)
    text = first.result()
    llama_model.Model._decode = replayed  # type: ignore[method-assign]
    from localspec.drafting.costs import CostModel

    cost = spec.engine.cost = CostModel({})  # what the replay teaches a cost model, by part (a fixed k has none)
    for drafter in spec.engine.drafters:
        if hasattr(drafter, "cost"):
            drafter.cost = cost
    again = spec.generate(PROMPT, max_tokens=tokens, seed=1, **sampler)
    assert again.result() == text, "the replay parted from the recorded run"
    llama_model.Model._decode = real  # type: ignore[method-assign]
    st = again.stats
    host = st.wall_seconds - st.target_seconds - st.draft_seconds  # (an earlier checkout's Stats has no host_seconds)
    learned = {part: getattr(cost, f"host_{part}", 0.0) * 1e3 for part in ("round", "position", "draft")}
    return {"per_token": host * 1e3 / st.completion_tokens, "per_round": host * 1e3 / st.target_passes, **learned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the localspec checkout to run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--target", help="a target model (name or path; default: the default pair's)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--flags", default="", help="flags added to every case (--raw for a model without a template)")
    parser.add_argument("--plain", help="also time llama-cpp-python's own loop on this GGUF file")
    parser.add_argument("--replay", action="store_true", help="the host's time with warm caches (fixed-k cases)")
    parser.add_argument(
        "--whole", type=int, metavar="PAIRS", help="whole processes: --no-draft against llama-cpp-python's loop"
    )
    args = parser.parse_args()
    if args.whole:
        whole(args.target or args.plain, args.flags.split(), args.tokens, args.whole)
        return
    if args.replay:
        print(
            "| case | host ms per token, caches warm | host ms per round | learned ms: a round, a position, a draft token |"
        )
        print("|---|---|---|---|")
        for case in args.cases.split(","):
            got = replay(case, args.tokens, args.target)
            learned = f"{got['round']:.3f}, {got['position']:.3f}, {got['draft']:.3f}"
            print(f"| {CASES[case][0]} | {got['per_token']:.3f} | {got['per_round']:.3f} | {learned} |")
        return
    cases = args.cases.split(",")
    seen: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for _ in range(args.runs):
        for case in cases:
            seen[case].append(generate(args.tree, CASES[case][1], args.tokens, args.target, args.flags.split()))
    print("| case | host ms per token | host ms per round | tokens | rounds | tokens per round |")
    print("|---|---|---|---|---|---|")
    for case, records in seen.items():
        host = [r["wall_seconds"] - r["target_seconds"] - r["draft_seconds"] for r in records]
        per_token = statistics.median(h * 1e3 / r["completion_tokens"] for h, r in zip(host, records, strict=True))
        per_round = statistics.median(h * 1e3 / r["target_passes"] for h, r in zip(host, records, strict=True))
        tokens = statistics.median(r["completion_tokens"] for r in records)
        rounds = statistics.median(r["target_passes"] for r in records)
        print(
            f"| {CASES[case][0]} | {per_token:.3f} | {per_round:.3f} | {tokens:.0f} | {rounds:.0f} | {tokens / rounds:.2f} |"
        )
    if args.plain:
        p = plain(args.plain, args.tokens)
        print(f"| plain llama-cpp-python, default sampler | {p['host_ms_per_token']:.3f} | | {p['tokens']} | | |")


if __name__ == "__main__":
    main()
