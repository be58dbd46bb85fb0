"""`localspec bench`: every strategy on the same models and prompts, one table (and JSON, PNG)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from localspec.api import LocalSpec, RunConfig, SamplerSettings, Stats, run_config
from localspec.errors import LocalspecError
from localspec.files import write_json
from localspec.frontends.generate import loading
from localspec.machine import COPIER, CostModel, lookup_reference, measure_costs, requantize


@dataclass(frozen=True)
class Strategy:
    """A way to run the pair: the settings `localspec generate` would be given for it."""

    name: str
    k: int | None  # None: the cost-aware planner
    draft: str = "auto"  # as --draft: "auto" (the draft model where it can win, plus the copier) or "copier"
    no_draft: bool = False
    copier: bool = True

    def config(self, base: RunConfig) -> RunConfig:
        return replace(
            base,
            k=self.k,
            draft=base.draft if self.draft == "auto" else self.draft,
            no_draft=self.no_draft,
            copier=self.copier,
        )


STRATEGIES = [
    Strategy("target-only", 0, no_draft=True),
    Strategy("draft_model k=2", 2, copier=False),
    Strategy("draft_model k=4", 4, copier=False),
    Strategy("draft_model k=8", 8, copier=False),
    Strategy("copier k=32", 32, draft="copier"),
    Strategy("auto", None),
]
LOOKUP = "llama-cpp-python prompt lookup"


def load_prompts(path: Path | None) -> list[dict[str, Any]]:
    """The built-in prompt set, or a JSONL file of {"prompt": ..., "task": optional name, "response_format":
    optional, OpenAI's, "suffix": optional, a fill-in-the-middle's}."""
    from localspec.frontends.bench_prompts import BUILTIN_PROMPTS, read_rows

    if path is None:
        return BUILTIN_PROMPTS
    try:
        return read_rows(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise LocalspecError(f"cannot read {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise LocalspecError(f'{path}: each line must be a JSON object with a "prompt"') from None


def _expected(alpha: float, k: float) -> float:
    """Tokens a round emits when each of k draft tokens holds with probability alpha: (1 - a^(k+1)) / (1 - a)."""
    return k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def ideal_speedup(alpha: float | None, k: float, c: float) -> float | None:
    """The paper's (1 - a^(k+1)) / ((1 - a)(k c + 1)); its verify cost is one target step at any k."""
    if alpha is None or k == 0:
        return None
    return _expected(alpha, k) / (k * c + 1)


def measured_ideal(alpha: float | None, k: float, c: float, cost: CostModel) -> float | None:
    """The same expectation priced with this machine's measured verify cost of k + 1 tokens."""
    if alpha is None or k == 0:
        return None
    t1 = cost.verify_cost(1)
    return _expected(alpha, k) * t1 / (k * c * t1 + cost.verify_cost(round(k) + 1))


@dataclass
class Totals:
    """One strategy's runs on one prompt, summed over rounds: times from the load on, and its clock."""

    stats: Stats = field(default_factory=Stats)
    load_seconds: float = 0.0
    first_token_seconds: float = 0.0  # from the start of the load
    total_seconds: float = 0.0  # from the start of the load to the last token
    clock_seconds: float = 0.0  # the clock's time for this strategy's tokens

    def add(self, stats: Stats, load: float, clock_speed: float | None) -> None:
        self.stats.add(stats)
        self.load_seconds += load
        self.first_token_seconds += load + (stats.first_token_seconds or 0.0)
        self.total_seconds += load + stats.prefill_seconds + stats.wall_seconds
        self.clock_seconds += stats.completion_tokens / clock_speed if clock_speed else 0.0

    @property
    def clock(self) -> float | None:
        """The clock's tok/s alongside these runs (the machine's speed while they ran)."""
        return self.stats.completion_tokens / self.clock_seconds if self.clock_seconds else None


def _row(strategy: str, task: str, t: Totals, base: Totals, c: float, cost: CostModel) -> dict[str, Any]:
    """One table row, against the target-only runs `base` of the same prompt.

    The decode speedup is this row's tok/s over its clock's, divided by the same ratio of the base
    (the machine's drift cancels, and so does any steady difference between the two copies of the
    target). The total speedup compares the whole wait, load and prefill included, with this row's
    decode time rescaled to the machine speed the base ran at and to the base's number of tokens
    (greedy answers can part at a near tie of the target's logits, and one may then run longer).
    """
    s = t.stats
    tps = s.tokens_per_second or 0.0
    per_clock = (base.stats.tokens_per_second or 0.0) / base.clock if base.clock else None
    speedup = tps / t.clock / per_clock if t.clock and per_clock else None
    decode_here = s.wall_seconds * (t.clock / base.clock) if t.clock and base.clock else s.wall_seconds
    if s.completion_tokens:
        decode_here *= base.stats.completion_tokens / s.completion_tokens
    total_here = t.load_seconds + s.prefill_seconds + decode_here
    mean_k = s.drafted / s.target_passes if s.target_passes else 0.0
    measured = s.wall_seconds and s.target_seconds  # the reference row has no decode timings
    host = s.host_seconds if measured else None  # outside both models' llama_decode
    ideal = ideal_speedup(s.acceptance_rate, mean_k, c)
    ideal_here = measured_ideal(s.acceptance_rate, mean_k, c, cost)
    return {
        "strategy": strategy,
        "task": task,
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "load_seconds": t.load_seconds,
        "prefill_seconds": s.prefill_seconds,
        "time_to_first_token": t.first_token_seconds,
        "decode_seconds": s.wall_seconds,
        "total_seconds": t.total_seconds,
        "total_speedup": base.total_seconds / total_here if total_here else None,
        "first_token_ratio": t.first_token_seconds / base.first_token_seconds if base.first_token_seconds else None,
        "tokens_per_second": tps,
        "clock_tokens_per_second": t.clock,
        "speedup": speedup,
        "acceptance_rate": s.acceptance_rate,
        "tokens_per_pass": s.tokens_per_pass,
        "mean_k": mean_k,
        "cost_ratio": c,
        "ideal_speedup": ideal,
        "efficiency": speedup / ideal if speedup and ideal else None,
        "ideal_speedup_measured_costs": ideal_here,
        "efficiency_measured_costs": speedup / ideal_here if speedup and ideal_here else None,
        "host_share": host / s.wall_seconds if host is not None else None,
        "host_ms_per_token": host * 1e3 / s.completion_tokens if host is not None and s.completion_tokens else None,
        "host_ms_per_round": host * 1e3 / s.target_passes if host is not None and s.target_passes else None,
        "wall_seconds": s.wall_seconds,
    }


def _counted(steps: Iterator[object], stats: Stats) -> Iterator[object]:
    for step in steps:
        stats.completion_tokens += 1
        yield step


class _Timed:
    """A generator stepped from outside, and the seconds spent inside it."""

    def __init__(self, steps: Iterator[object]) -> None:
        self.steps, self.seconds, self.done = steps, 0.0, False
        self.first_step: float | None = None

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

    def __init__(
        self, alone: LocalSpec, prompt: dict[str, Any], max_tokens: int, sampler: SamplerSettings, seed: int
    ) -> None:
        self.alone, self.prompt = alone, prompt  # `alone` has no drafter
        self.max_tokens, self.sampler, self.seed = max_tokens, sampler, seed
        self.stats = Stats()  # of the generation running now
        self.tokens = 0  # tokens of the generations finished so far
        self.first_prefill: float | None = None
        self.timed = _Timed(self._forever())

    def _forever(self) -> Iterator[object]:
        while True:
            p = self.prompt
            run = self.alone.generate(
                p["prompt"], max_tokens=self.max_tokens, sampler=self.sampler, seed=self.seed, suffix=p.get("suffix")
            )
            self.stats = run.stats
            yield from run
            self.tokens += self.stats.completion_tokens
            if self.first_prefill is None:
                self.first_prefill = self.stats.prefill_seconds
            self.stats = Stats()  # counted: until the next generation starts, nothing is running
            yield None  # a step even when a generation emitted no text

    def speed(self) -> float | None:
        """Tokens per second so far."""
        st = self.stats
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


def run_bench(
    base: RunConfig,
    alone: LocalSpec,
    cost: CostModel,
    prompts: list[dict[str, Any]],
    *,
    max_tokens: int,
    strategies: list[Strategy],
    lookup: bool,
    repeat: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every strategy on every prompt as `localspec generate` would: load, prefill, decode.

    Each run loads its models afresh (what the user waits for) and is paired with a clock:
    target-only decoding on `alone` (a second copy of the target, kept loaded, with no drafter) run alongside
    it, so the machine's drift cancels from the speedups; `cost` (the pair's) prices the rows. With repeat > 1
    each prompt runs in rounds, in rotated order, and each row sums its rounds. The first strategy is the
    baseline.
    """
    c = cost.draft_token / cost.verify_cost(1)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for p in prompts:
        prompt = alone.tokens(p["prompt"], suffix=p.get("suffix"))
        totals = {st.name: Totals() for st in strategies}
        for r in range(repeat):
            for st in strategies[r % len(strategies) :] + strategies[: r % len(strategies)]:
                said = _run_strategy(st.config(base), alone, p, totals[st.name], max_tokens=max_tokens)
                notes += [n for n in said if n.split(" (")[0] not in (m.split(" (")[0] for m in notes)]
                if progress:
                    progress(f"{p['task']}: {st.name}")
        baseline = totals[strategies[0].name]
        rows += [
            _row(st.name, p["task"], totals[st.name], baseline, c if st.k and not st.copier else 0.0, cost)
            for st in strategies
        ]
        if lookup and not p.get("response_format"):  # llama.cpp's lookup decoding takes no grammar
            try:
                rows.append(
                    _row(LOOKUP, p["task"], _run_lookup(alone, prompt, p, base, max_tokens), baseline, 0.0, cost)
                )
            except Exception as e:
                notes.append(f"{LOOKUP} failed on {p['task']}: {type(e).__name__}: {e}")
            if progress:
                progress(f"{p['task']}: {LOOKUP}")
    return {
        "target": str(alone.target_path),
        "rows": rows,
        "notes": notes,
        "cost_ratio": c,
        "verify_costs_seconds": cost.curve(),
        "draft_token_seconds": cost.draft_token,
    }


def _run_strategy(cfg: RunConfig, alone: LocalSpec, p: dict[str, Any], totals: Totals, *, max_tokens: int) -> list[str]:
    """One run of a strategy on prompt `p`, loaded afresh and paired with `alone`'s clock, added to `totals`;
    what its load said."""
    sampler, seed = cfg.sampler, cfg.seed or 0
    t0 = time.perf_counter()
    spec = LocalSpec.from_config(cfg)
    load = time.perf_counter() - t0
    gen = spec.generate(
        p["prompt"],
        max_tokens=max_tokens,
        sampler=sampler,
        seed=seed,
        response_format=p.get("response_format"),
        suffix=p.get("suffix"),
    )
    stats = gen.stats
    run = _Timed(iter(gen))
    speed = _paired(run, _Clock(alone, p, max_tokens, sampler, seed))
    stats.wall_seconds = run.seconds - stats.prefill_seconds  # its own steps only
    totals.add(stats, load, speed)
    spec.save_costs()
    return spec.notes  # the models are freed as it returns, before the next run loads its own


def _run_lookup(alone: LocalSpec, prompt: list[int], p: dict[str, Any], base: RunConfig, max_tokens: int) -> Totals:
    """llama-cpp-python's own prompt lookup on prompt `p` (its tokens `prompt`), paired with `alone`'s clock."""
    sampler, seed = base.sampler, base.seed or 0
    t0 = time.perf_counter()
    stats, steps = Stats(), lookup_reference(alone, prompt, max_tokens=max_tokens, sampler=sampler, seed=seed)
    load = time.perf_counter() - t0
    run = _Timed(_counted(steps, stats))
    speed = _paired(run, _Clock(alone, p, max_tokens, sampler, seed))
    stats.prompt_tokens, stats.prefill_seconds, stats.wall_seconds = len(prompt), run.first_step or 0.0, run.paced
    stats.first_token_seconds = stats.prefill_seconds
    stats.completion_tokens -= 1  # the first token's time is in the prefill
    ref = Totals()
    ref.add(stats, load, speed)
    return ref


def _fmt(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


_COLUMNS = [  # (header, row key, format; None: as it is)
    ("task", "task", None),
    ("strategy", "strategy", None),
    ("load s", "load_seconds", ".2f"),
    ("prefill s", "prefill_seconds", ".2f"),
    ("first tok s", "time_to_first_token", ".2f"),
    ("decode s", "decode_seconds", ".2f"),
    ("total s", "total_seconds", ".2f"),
    ("total ×", "total_speedup", ".2f"),
    ("tok/s", "tokens_per_second", ".1f"),
    ("decode ×", "speedup", ".2f"),
    ("α", "acceptance_rate", ".2f"),
    ("tok/pass", "tokens_per_pass", ".2f"),
    ("ideal (here)", "ideal_speedup_measured_costs", ".2f"),
    ("eff. (here)", "efficiency_measured_costs", ".0%"),
    ("host", "host_share", ".1%"),
    ("host ms/tok", "host_ms_per_token", ".3f"),
    ("host ms/round", "host_ms_per_round", ".3f"),
]


def print_table(result: dict[str, Any], console: Console) -> None:
    """The bench table: one row per strategy and task, the whole wait first, then the decode."""
    table = Table(title="localspec bench", header_style="bold")
    for col, _, _ in _COLUMNS:
        table.add_column(col, justify="left" if col in ("task", "strategy") else "right")
    for r in result["rows"]:
        table.add_row(*(r[key] if spec is None else _fmt(r[key], spec) for _, key, spec in _COLUMNS))
    console.print(table)
    console.print(
        "times are summed over --repeat rounds, from the start of each run's model load · total ×: the "
        "target alone's total time over this row's (decode rescaled to the machine speed the target alone "
        "ran at) · decode ×: tok/s against the target alone, each measured against a clock (a second copy "
        "of the target decoding alone, run in turns alongside it) · ideal (here): the paper's speedup from α, "
        "priced with this machine's measured verify cost of k+1 tokens · host: share of decode wall time "
        "outside llama_decode (sampling, drafting's bookkeeping, text), and its milliseconds per token and round"
    )
    for note in result["notes"]:
        console.print(f"note: {note}")


def plot(result: dict[str, Any], path: Path) -> None:
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
        row: list[dict[str, Any]] = [
            next((r for r in rows if r["task"] == t and r["strategy"] == st), {}) for t in tasks
        ]
        speed, _ = (
            ax.bar([j + i * width for j in range(len(tasks))], [r.get(key) or 0 for r in row], width, label=st)
            for ax, key in zip(axes, ("tokens_per_second", "acceptance_rate"), strict=False)
        )
        speed_labels = [f"{r['total_speedup']:.2f}×" if r.get("total_speedup") else "" for r in row]
        axes[0].bar_label(speed, speed_labels, fontsize=6, rotation=90, padding=2)
    axes[0].margins(y=0.15)
    axes[0].set_ylabel("tokens / s (decode); bar labels: total-time speedup")
    axes[1].set_ylabel("acceptance rate α")
    axes[1].set_xticks([j + 0.4 - width / 2 for j in range(len(tasks))], tasks)
    axes[0].legend(fontsize=8, ncol=2)
    axes[0].set_title("localspec bench: speed and acceptance by strategy and task")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chosen_strategies(names: str | None) -> list[Strategy]:
    """The strategies named (comma-separated; None: all), the target alone always among them: the baseline."""
    if not names:
        return STRATEGIES
    named = [n.strip() for n in names.split(",") if n.strip()]
    if unknown := [n for n in named if n not in {st.name for st in STRATEGIES}]:
        known = ", ".join(st.name for st in STRATEGIES)
        raise LocalspecError(f"--strategies: unknown strategy {unknown[0]!r} (known: {known})")
    return [st for st in STRATEGIES if st.k == 0 or st.name in named]


def bench_command(
    *,
    prompts: Path | None,
    json_out: Path | None,
    plot_out: Path | None,
    strategies: str | None,
    max_tokens: int,
    temperature: float,
    seed: int,
    repeat: int,
    lookup: bool,
    requantize: str | None,
    target: str | None,
    draft: str,
    ctx: int,
    threads: int | None,
    gpu_layers: int,
    draft_gpu_layers: int,
    flash_attn: bool,
) -> None:
    """`localspec bench`: every strategy on every prompt, its table printed (and its figures and plot written)."""
    chosen, rows = chosen_strategies(strategies), load_prompts(prompts)
    target = str(requantized(target, requantize.upper())) if requantize else target
    cfg = run_config(
        target,
        "auto" if draft in COPIER else draft,
        ctx=ctx,
        threads=threads,
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
        flash_attn=flash_attn,
        temperature=temperature,
        seed=seed,
        cache_ram=0,  # every run prefills its prompt: a restored one would time something else
        cache_disk=0,
        recall=False,  # nor drafted from the answer of the run before
    )
    with loading("loading the clock and measuring this machine's decode costs…"):
        alone = LocalSpec.from_config(replace(cfg, no_draft=True))  # the clock every run is timed against
        cost = measure_costs(alone, cfg)  # what the rows are priced with: the pair's
    runs = len(rows) * (repeat * len(chosen) + int(lookup))  # the prompt-lookup reference: one run a prompt
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("bench", total=runs)
        result = run_bench(
            cfg,
            alone,
            cost,
            rows,
            max_tokens=max_tokens,
            strategies=chosen,
            lookup=lookup,
            repeat=repeat,
            progress=lambda what: bar.update(task, advance=1, description=what),
        )
    out = Console()
    print_table(result, out if out.is_terminal else Console(width=200))
    if json_out:
        write_json(json_out, result)
    if plot_out:
        plot(result, plot_out)


def requantized(target: str | None, quant: str) -> Path:
    """The target (default: the default pair's) requantized to `quant`, made once beside it."""
    with loading(f"requantizing the target to {quant} (once)…"):
        return requantize(target, quant)
