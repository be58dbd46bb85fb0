"""`localspec bench`: every strategy on the same models and prompts, one table (and JSON, PNG)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

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


def _row(strategy: str, task: str, s: Stats, clock: float | None, per_clock: float | None, c: float,
         cost: CostModel) -> dict:
    """One table row.

    clock: tok/s of the target-only twin run alongside this row's runs; per_clock: the target-only
    row's tok/s over its own clock. The speedup is this row's tok/s over its clock, divided by that.
    """
    tps = s.tokens_per_second or 0.0
    mean_k = s.drafted / s.target_passes if s.target_passes else 0.0
    measured = s.wall_seconds and s.target_seconds  # the reference row has no decode timings
    overhead = 1 - (s.target_seconds + s.draft_seconds) / s.wall_seconds if measured else None
    ideal = ideal_speedup(s.acceptance_rate, mean_k, c)
    ideal_here = measured_ideal(s.acceptance_rate, mean_k, c, cost)
    speedup = tps / clock / per_clock if clock and per_clock else None
    return {"strategy": strategy, "task": task, "completion_tokens": s.completion_tokens,
            "tokens_per_second": tps, "clock_tokens_per_second": clock, "speedup": speedup,
            "acceptance_rate": s.acceptance_rate,
            "tokens_per_pass": s.tokens_per_pass, "mean_k": mean_k, "cost_ratio": c,
            "ideal_speedup": ideal, "efficiency": speedup / ideal if speedup and ideal else None,
            "ideal_speedup_measured_costs": ideal_here,
            "efficiency_measured_costs": speedup / ideal_here if speedup and ideal_here else None,
            "python_overhead": overhead, "wall_seconds": s.wall_seconds}


def _lookup_reference(target_path: Path, prompt: list[int], max_tokens: int, n_threads: int | None,
                      sampler: SamplerSettings, seed: int, stats: Stats) -> Iterator[None]:
    """llama-cpp-python's own prompt-lookup drafting (its draft_model= path), loaded now: a step per token."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    # Its speculative path reads scores at every position and, given a draft_model, turns logits_all on
    # itself, but sizes its score array from the flag as passed: without logits_all=True here it fails
    # with a numpy broadcast error. That array is n_ctx x n_vocab floats, so this reference (only) runs
    # with a context just big enough for the prompt and the answer; localspec asks only where needed.
    n_ctx = len(prompt) + max_tokens + 64
    llm = new_llama(model_path=str(target_path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                    logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), verbose=False)
    stats.prompt_tokens = len(prompt)

    def steps() -> Iterator[None]:
        for _ in llm.create_completion(prompt, max_tokens=max_tokens, temperature=sampler.temperature,
                                       top_k=sampler.top_k, top_p=sampler.top_p, min_p=sampler.min_p,
                                       seed=seed, stream=True):
            stats.completion_tokens += 1
            yield
    return steps()


class _Timed:
    """A generator stepped from outside, and the seconds spent inside it."""

    def __init__(self, steps: Iterator[object]) -> None:
        self.steps, self.seconds, self.first_step, self.done = steps, 0.0, None, False

    @property
    def paced(self) -> float:
        """Seconds after the first step (which holds the prefill): the stretch that is paired."""
        return self.seconds - (self.first_step or 0.0)

    def step(self) -> None:
        t0 = time.perf_counter()
        try:
            next(self.steps)
        except StopIteration:
            self.done = True
        self.seconds += time.perf_counter() - t0
        if self.first_step is None:
            self.first_step = self.seconds


class _Clock:
    """Target-only decoding of a prompt on a second copy of the target, restarted whenever it ends.

    Run alongside a strategy, its speed is the yardstick of the machine's speed in those same seconds.
    Only the first generation's prefill is left out of its time: a restart's prefill is one decode
    of the cached prompt's last token, as dear as a step, for the token it yields.
    """

    def __init__(self, twin: Model, prompt: list[int], max_tokens: int, sampler: SamplerSettings, seed: int) -> None:
        self.engine = Engine(twin, None, sampler, 0, seed)
        self.prompt, self.max_tokens = prompt, max_tokens
        self.tokens, self.first_prefill = 0, None  # tokens of the generations finished so far
        self.timed = _Timed(self._forever())

    def _forever(self) -> Iterator[object]:
        while True:
            yield from self.engine.generate(self.prompt, self.max_tokens)
            self.tokens += self.engine.stats.completion_tokens
            if self.first_prefill is None:
                self.first_prefill = self.engine.stats.prefill_seconds
            self.engine.stats = Stats()  # counted: until the next generation starts, nothing is running
            yield None  # a step even when a generation emitted no text

    def speed(self) -> float | None:
        """Tokens per second so far."""
        st = self.engine.stats
        seconds = self.timed.seconds - (st.prefill_seconds if self.first_prefill is None else self.first_prefill)
        return (self.tokens + st.completion_tokens) / seconds if seconds > 0 else None


QUANTUM = 0.25  # seconds one side may lead the other before they switch


def _paired(run: _Timed, clock: _Clock) -> float | None:
    """Step `run` to its end, and the clock alongside it, in turns of about 2 * QUANTUM seconds each.

    Both share the same seconds of the machine, so a machine whose speed drifts (load, thermals, a
    shared VM) slows both alike. Turns of several steps give a run of wide verifies and one of single
    tokens the same pattern of switches. The clock ends with as much time as the run; returns its tok/s.
    """
    side = run
    while not run.done:
        lead = run.paced - clock.timed.paced
        if side is run and lead > QUANTUM:
            side = clock.timed
        elif side is clock.timed and lead < -QUANTUM:
            side = run
        side.step()
    while clock.timed.paced < run.paced:  # its share of a run shorter than a turn
        clock.timed.step()
    return clock.speed()


def run_bench(target: Model, draft: Model, twin: Model, cost: CostModel, prompts: list[dict[str, str]], *,
              max_tokens: int, sampler: SamplerSettings, seed: int, lookup: bool, repeat: int = 1,
              progress: Callable[[str], None] | None = None) -> dict:
    """Run every strategy on every prompt; return rows, notes and the cost model.

    Each run is paired with a clock: target-only decoding on `twin` (a second copy of the target)
    run alongside it. A row's speed over its clock's, divided by the same ratio of the target-only
    row, is its speedup: the machine's drift cancels, and so does any steady difference between the
    two copies. With repeat > 1 each prompt runs in rounds, in rotated order, and each row sums its rounds.
    """
    c = cost.draft_token / cost.verify_cost(1)
    rows, notes = [], []
    for p in prompts:
        prompt = chat_tokens(target, [{"role": "user", "content": p["prompt"]}])
        totals = {st.name: Stats() for st in STRATEGIES}
        clock_seconds = {st.name: 0.0 for st in STRATEGIES}  # the clock's time for each round's tokens, summed
        for r in range(repeat):
            for st in STRATEGIES[r % len(STRATEGIES):] + STRATEGIES[:r % len(STRATEGIES)]:
                target.reset()
                draft.reset()
                engine = Engine(target, draft if st.model else None, sampler, st.k, seed, ngram=st.ngram, cost=cost)
                run = _Timed(engine.generate(prompt, max_tokens))
                speed = _paired(run, _Clock(twin, prompt, max_tokens, sampler, seed))
                engine.stats.wall_seconds = run.seconds - engine.stats.prefill_seconds  # its own steps only
                totals[st.name].add(engine.stats)
                clock_seconds[st.name] += engine.stats.completion_tokens / speed if speed else 0.0
                if progress:
                    progress(f"{p['task']}: {st.name}")
        clock = {name: totals[name].completion_tokens / sec if sec else None for name, sec in clock_seconds.items()}
        base = next(st.name for st in STRATEGIES if st.k == 0)
        per_clock = (totals[base].tokens_per_second or 0.0) / clock[base] if clock[base] else None
        rows += [_row(st.name, p["task"], totals[st.name], clock[st.name], per_clock, c if st.model else 0.0, cost)
                 for st in STRATEGIES]
        if lookup:
            stats = Stats()
            try:
                run = _Timed(_lookup_reference(target.path, prompt, max_tokens, target.n_threads, sampler, seed,
                                               stats))
                speed = _paired(run, _Clock(twin, prompt, max_tokens, sampler, seed))
                stats.prefill_seconds = run.first_step or 0.0
                stats.wall_seconds = run.paced
                stats.completion_tokens -= 1  # the first token's time is in the prefill
                rows.append(_row(LOOKUP, p["task"], stats, speed, per_clock, 0.0, cost))
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
    console.print("speedup: tok/s against target-only decoding, each measured against a clock (a second copy of "
                  "the target decoding alone, run in turns alongside it) · c: draft/target cost per token · ideal: "
                  "the paper's speedup from α and c (verify costs one target step) · here: priced with this "
                  "machine's measured verify cost of k+1 tokens · python: share of decode wall time outside llama.cpp")
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
        row = [next((r for r in rows if r["task"] == t and r["strategy"] == st), {}) for t in tasks]
        speed, _ = (ax.bar([j + i * width for j in range(len(tasks))], [r.get(key) or 0 for r in row], width, label=st)
                    for ax, key in zip(axes, ("tokens_per_second", "acceptance_rate")))
        speed_labels = [f"{r['speedup']:.2f}×" if r.get("speedup") else "" for r in row]
        axes[0].bar_label(speed, speed_labels, fontsize=6, rotation=90, padding=2)
    axes[0].margins(y=0.15)
    axes[0].set_ylabel("tokens / s (decode); bar labels: speedup")
    axes[1].set_ylabel("acceptance rate α")
    axes[1].set_xticks([j + 0.4 - width / 2 for j in range(len(tasks))], tasks)
    axes[0].legend(fontsize=8, ncol=2)
    axes[0].set_title("localspec bench: speed and acceptance by strategy and task")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
