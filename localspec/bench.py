"""`localspec bench`: every strategy on the same models and prompts, one table (and JSON, PNG)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

from localspec.controller import CostModel
from localspec.engine import Engine, Stats
from localspec.errors import LocalspecError
from localspec.model import Model, new_llama
from localspec.prompt import chat_tokens
from localspec.sampling import SamplerSettings


@dataclass(frozen=True)
class Strategy:
    name: str
    k: int | None  # None: the cost-aware controller
    model: bool  # the draft model drafts
    ngram: bool  # n-gram copying drafts


STRATEGIES = [
    Strategy("target-only", 0, False, False),
    Strategy("model k=2", 2, True, False),
    Strategy("model k=4", 4, True, False),
    Strategy("model k=8", 8, True, False),
    Strategy("ngram k=32", 32, False, True),
    Strategy("auto", None, True, True),
]
LOOKUP = "llama-cpp-python prompt lookup"


def load_prompts(path: Path | None) -> list[dict[str, str]]:
    """The built-in prompt set, or a JSONL file of {"prompt": ..., "task": optional name}."""
    if path is None:
        from localspec.prompts import BUILTIN_PROMPTS
        return BUILTIN_PROMPTS
    try:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        return [{"task": str(r.get("task", f"prompt-{i + 1}")), "prompt": str(r["prompt"])} for i, r in enumerate(rows)]
    except OSError as e:
        raise LocalspecError(f"cannot read {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise LocalspecError(f"{path}: each line must be a JSON object with a \"prompt\"") from None


def ideal_speedup(alpha: float | None, k: float, c: float) -> float | None:
    """The paper's (1 - a^(k+1)) / ((1 - a)(k c + 1)); its verify cost is one target step at any k."""
    if alpha is None or k == 0:
        return None
    expected = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected / (k * c + 1)


def measured_ideal(alpha: float | None, k: float, c: float, cost: CostModel) -> float | None:
    """The same expectation priced with this machine's measured verify cost of k + 1 tokens."""
    if alpha is None or k == 0:
        return None
    expected = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    t1 = cost.verify_cost(1)
    return expected * t1 / (k * c * t1 + cost.verify_cost(round(k) + 1))


def _row(strategy: str, task: str, s: Stats, baseline_tps: float | None, c: float, cost: CostModel) -> dict:
    tps = s.tokens_per_second or 0.0
    mean_k = s.drafted / s.target_passes if s.target_passes else 0.0
    measured = s.wall_seconds and s.target_seconds  # the reference row has no decode timings
    overhead = 1 - (s.target_seconds + s.draft_seconds) / s.wall_seconds if measured else None
    ideal = ideal_speedup(s.acceptance_rate, mean_k, c)
    ideal_here = measured_ideal(s.acceptance_rate, mean_k, c, cost)
    speedup = tps / baseline_tps if baseline_tps else None
    return {"strategy": strategy, "task": task, "completion_tokens": s.completion_tokens,
            "tokens_per_second": tps, "speedup": speedup, "acceptance_rate": s.acceptance_rate,
            "tokens_per_pass": s.tokens_per_pass, "mean_k": mean_k, "cost_ratio": c,
            "ideal_speedup": ideal, "efficiency": speedup / ideal if speedup and ideal else None,
            "ideal_speedup_measured_costs": ideal_here,
            "efficiency_measured_costs": speedup / ideal_here if speedup and ideal_here else None,
            "python_overhead": overhead, "wall_seconds": s.wall_seconds}


def _lookup_reference(target_path: Path, prompt: list[int], max_tokens: int, n_threads: int | None) -> Stats:
    """llama-cpp-python's own prompt-lookup drafting (its draft_model= path), decode time only."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    # Its speculative path reads scores at every position and, given a draft_model, turns logits_all on
    # itself, but sizes its score array from the flag as passed: without logits_all=True here it fails
    # with a numpy broadcast error. That array is n_ctx x n_vocab floats, so this reference (only) runs
    # with a context just big enough for the prompt and the answer; localspec asks only where needed.
    n_ctx = len(prompt) + max_tokens + 64
    llm = new_llama(model_path=str(target_path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                    logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), verbose=False)
    stats, first = Stats(prompt_tokens=len(prompt)), None
    t0 = time.perf_counter()
    for _ in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True):
        if first is None:
            first = time.perf_counter()
            stats.prefill_seconds = first - t0
        stats.completion_tokens += 1
    stats.wall_seconds = time.perf_counter() - (first or t0)
    stats.completion_tokens -= 1  # the first token's time is in the prefill
    return stats


def run_bench(target: Model, draft: Model, cost: CostModel, prompts: list[dict[str, str]], *, max_tokens: int,
              sampler: SamplerSettings, seed: int, lookup: bool, repeat: int = 1,
              progress: Callable[[str], None] | None = None) -> dict:
    """Run every strategy on every prompt; return rows, notes and the cost model.

    With repeat > 1 the strategies run in interleaved rounds, each round in a rotated order, and each
    row sums its rounds: a machine whose speed drifts (load, thermals, a shared VM) shifts every row alike.
    """
    c = cost.draft_token / cost.verify_cost(1)
    rows, notes = [], []
    for p in prompts:
        prompt = chat_tokens(target, [{"role": "user", "content": p["prompt"]}])
        totals = {st.name: Stats() for st in STRATEGIES}
        for r in range(repeat):
            for st in STRATEGIES[r % len(STRATEGIES):] + STRATEGIES[:r % len(STRATEGIES)]:
                target.reset()
                draft.reset()
                engine = Engine(target, draft if st.model else None, sampler, st.k, seed, ngram=st.ngram, cost=cost)
                for _ in engine.generate(prompt, max_tokens):
                    pass
                totals[st.name].add(engine.stats)
                if progress:
                    progress(f"{p['task']}: {st.name}")
        baseline = next(totals[st.name].tokens_per_second for st in STRATEGIES if st.k == 0)
        rows += [_row(st.name, p["task"], totals[st.name], baseline, c if st.model else 0.0, cost) for st in STRATEGIES]
        if lookup:
            try:
                s = _lookup_reference(target.path, prompt, max_tokens, target.n_threads)
                rows.append(_row(LOOKUP, p["task"], s, baseline, 0.0, cost))
            except Exception as e:  # noqa: BLE001 - a reference row: report its failure, go on
                notes.append(f"{LOOKUP} failed on {p['task']}: {type(e).__name__}: {e}")
            if progress:
                progress(f"{p['task']}: {LOOKUP}")
    return {"rows": rows, "notes": notes, "cost_ratio": c,
            "verify_costs_seconds": cost.curve(), "draft_token_seconds": cost.draft_token}


def _fmt(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def print_table(result: dict, console: Console) -> None:
    """The bench table: one row per strategy and task."""
    table = Table(title="localspec bench", header_style="bold")
    for col in ("task", "strategy", "tok/s", "speedup", "α", "tok/pass", "c", "ideal", "eff.",
                "ideal (here)", "eff. (here)", "python"):
        table.add_column(col, justify="left" if col in ("task", "strategy") else "right")
    for r in result["rows"]:
        table.add_row(r["task"], r["strategy"], _fmt(r["tokens_per_second"], ".1f"), _fmt(r["speedup"], ".2f"),
                      _fmt(r["acceptance_rate"], ".2f"), _fmt(r["tokens_per_pass"], ".2f"),
                      _fmt(r["cost_ratio"], ".2f"), _fmt(r["ideal_speedup"], ".2f"), _fmt(r["efficiency"], ".0%"),
                      _fmt(r["ideal_speedup_measured_costs"], ".2f"), _fmt(r["efficiency_measured_costs"], ".0%"),
                      _fmt(r["python_overhead"], ".1%"))
    console.print(table)
    console.print("c: draft/target cost per token · ideal: the paper's speedup from α and c (verify costs one "
                  "target step) · here: priced with this machine's measured verify cost of k+1 tokens · "
                  "python: share of decode wall time outside llama.cpp")
    for note in result["notes"]:
        console.print(f"note: {note}")


def plot(result: dict, path: Path) -> None:
    """Bars of tok/s and acceptance rate per strategy, one group per task."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LocalspecError("--plot needs matplotlib: pip install 'localspec[bench]'") from None
    rows = result["rows"]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 2.2 * len(tasks)), 8), sharex=True)
    width = 0.8 / len(strategies)
    for i, st in enumerate(strategies):
        for ax, key in zip(axes, ("tokens_per_second", "acceptance_rate")):
            vals = [next((r[key] or 0 for r in rows if r["task"] == t and r["strategy"] == st), 0) for t in tasks]
            ax.bar([j + i * width for j in range(len(tasks))], vals, width, label=st)
    axes[0].set_ylabel("tokens / s (decode)")
    axes[1].set_ylabel("acceptance rate α")
    axes[1].set_xticks([j + 0.4 - width / 2 for j in range(len(tasks))], tasks)
    axes[0].legend(fontsize=8, ncol=2)
    axes[0].set_title("localspec bench: speed and acceptance by strategy and task")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
