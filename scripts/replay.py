"""Replay recorded greedy answers through the drafters against a measured cost curve (no model needed).

The copier's priors (`_PRIOR_COPIED` in localspec/drafting/copier.py) and the planner are tuned this
way: a change is judged by the decode speedup it would have given on real answers, in seconds, not
by a rerun of the models. Two steps:

    python scripts/replay.py record scripts/replay-answers.json   # greedy target-alone answers (loads the target)
    python scripts/replay.py replay scripts/replay-answers.json   # the estimate, per prompt (pure Python)
    python scripts/replay.py record --fim -n 128 scripts/replay-fim.json   # an editor's autocomplete requests

`record` stores each bench prompt's tokens, the target's greedy answer and this machine's measured
verify curve; `replay` walks each answer the way the engine would: the planner picks a draft, the
longest prefix that matches the answer is accepted plus one token, and the round is priced with the
recorded curve. --curve FILE replays against another curve (a costs.json entry's "verify" mapping).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from localspec.decoding.planner import NONE, Planner
from localspec.drafting.copier import Copier, LineJoin
from localspec.drafting.costs import CostModel


def record(out: Path, max_tokens: int, fim: bool = False) -> None:
    """Greedy answers of the built-in bench prompts (or its fill-in-the-middle ones), with the tokenizer's
    pieces the line-joiner needs."""
    from localspec.core.sampling import SamplerSettings
    from localspec.decoding.engine import Engine, Request
    from localspec.decoding.loader import RunConfig, load_models
    from localspec.drafting.calibration import load_costs
    from localspec.frontends.bench_prompts import BUILTIN_PROMPTS, FIM_PROMPTS
    from localspec.llama.template import chat_tokens, fim_tokens

    target, _ = load_models(RunConfig(no_draft=True))
    cost = load_costs(target, None)
    rows = []
    for p in FIM_PROMPTS if fim else BUILTIN_PROMPTS:
        fill = p.get("suffix") is not None
        if fill:
            prompt = fim_tokens(target, p["prompt"], p["suffix"])
        else:
            prompt = chat_tokens(target, [{"role": "user", "content": p["prompt"]}])
        run = Engine(target, [], 0).generate(
            Request(tuple(prompt), max_tokens, SamplerSettings(temperature=0), fill=fill)
        )
        "".join(piece.text for piece in run)
        answer = run.tokens
        rows.append({"task": p["task"], "prompt": prompt, "answer": answer, "fill": fill})
        print(f"{p['task']}: {len(prompt)} prompt tokens, {len(answer)} answer tokens", flush=True)
    used = {t for r in rows for t in r["prompt"] + r["answer"]}
    pieces = {str(t): target.piece(t).decode("latin-1") for t in used}
    # the line-joiner tokenizes joined words: keep the tokenizations it asked for while recording
    joins: dict[str, list[int]] = {}
    for r in rows:
        join = LineJoin(target.piece, target.tokenize)
        ctx = r["prompt"]
        for i in range(len(ctx)):
            if (hit := join(ctx[i : i + LineJoin.MAX_WORD + 1])) is not None:
                text = target.piece(ctx[i])[:-1] + b" " + b"".join(target.piece(t) for t in ctx[i + 1 : i + hit[0]])
                joins[text.decode("latin-1")] = list(hit[1])
    out.write_text(json.dumps({"verify": cost.curve(), "pieces": pieces, "joins": joins, "answers": rows}))


def replay(path: Path, curve: Path | None = None) -> list[dict[str, float | int | str]]:
    """The copier on each recorded answer: passes, drafted and accepted tokens, and the decode speedup."""
    data = json.loads(path.read_text())
    verify = json.loads(curve.read_text()) if curve else data["verify"]
    cost = CostModel({int(n): float(s) for n, s in verify.items()})
    pieces = {int(t): p.encode("latin-1") for t, p in data["pieces"].items()}
    joins = {text.encode("latin-1"): tokens for text, tokens in data["joins"].items()}

    def tokenize(text: str) -> list[int]:
        return joins.get(text.encode("utf-8", "surrogatepass"), [-1])  # an unknown join never matches

    results = []
    for row in data["answers"]:
        drafter = Copier(LineJoin(lambda t: pieces.get(t, b"?"), tokenize), piece=lambda t: pieces.get(t, b""))
        planner = Planner([drafter], k=None, cost=cost)
        prompt, answer = row["prompt"], row["answer"]
        drafter.begin(len(prompt), fill=row.get("fill", False))
        ctx, i, seconds, passes, drafted, accepted = list(prompt), 0, 0.0, 0, 0, 0
        while i < len(answer):
            plan = planner.plan(ctx, len(answer) - i - 1) if i else NONE  # the engine emits the first token at once
            proposal = drafter.propose(ctx, plan.k) if plan.drafter else []
            n = 0
            while n < len(proposal) and proposal[n] == answer[i + n]:
                n += 1
            emitted = answer[i : i + n + 1]
            ctx += emitted
            i += len(emitted)
            seconds += cost.verify_cost(len(proposal) + 1)
            passes, drafted, accepted = passes + 1, drafted + len(proposal), accepted + n
            planner.accept(ctx, replace(plan, k=len(proposal)), n)
        results.append(
            {
                "task": row["task"],
                "tokens": len(answer),
                "passes": passes,
                "drafted": drafted,
                "accepted": accepted,
                "plain_seconds": len(answer) * cost.verify_cost(1),
                "seconds": seconds,
            }
        )
    return results


def report(results: list[dict[str, float | int | str]]) -> None:
    print(f"{'task':14} {'tokens':>6} {'passes':>6} {'drafted':>7} {'accepted':>8} {'decode ×':>8}")
    for r in results:
        print(
            f"{r['task']:14} {r['tokens']:6} {r['passes']:6} {r['drafted']:7} {r['accepted']:8} "
            f"{float(r['plain_seconds']) / float(r['seconds']):8.2f}"
        )
    plain, spec = (sum(float(r[key]) for r in results) for key in ("plain_seconds", "seconds"))
    print(f"{'all':14} {'':6} {'':6} {'':7} {'':8} {plain / spec:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record greedy answers (loads the target)")
    rec.add_argument("out", type=Path)
    rec.add_argument("-n", "--max-tokens", type=int, default=400)
    rec.add_argument("--fim", action="store_true", help="the fill-in-the-middle prompts (an editor's autocomplete)")
    rep = sub.add_parser("replay", help="replay recorded answers through the copier")
    rep.add_argument("answers", type=Path)
    rep.add_argument("--curve", type=Path, help="a JSON mapping of batch size to verify seconds")
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, args.max_tokens, args.fim)
    else:
        report(replay(args.answers, args.curve))


if __name__ == "__main__":
    main()
