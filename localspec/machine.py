"""The machine and the pair here, as `localspec doctor` and `localspec bench` read them: the llama.cpp build,
what the cost store has learned, the draft model's verdict, a speed test of a model file, and the bench's
diagnostics (costs measured now, llama-cpp-python's own prompt lookup, a requantized target).

Beside the API (localspec.api) at the facade's level: frontends read the machine here, never below it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from localspec.api import LocalSpec, RunConfig, SamplerSettings, run_config
from localspec.decoding.loader import (
    COPIER,
    answers_dir,
    default_threads,
    gpu_layers,
    load_draft,
    load_models,
    prompts_dir,
    store_keys,
)
from localspec.drafting import store
from localspec.drafting.calibration import calibrate, load_costs
from localspec.drafting.costs import CostModel
from localspec.drafting.policy import verdict
from localspec.llama.model import (
    EXACT_BUILD,
    Model,
    amx_weights_disabled,
    build,
    llamafile_built,
)
from localspec.llama.model import requantize as requantize_model
from localspec.llama.prompts import clear, folder_usage
from localspec.models.catalog import default_pair, resolve
from localspec.settings import HARDWARE, default

__all__ = [
    "COPIER",
    "EXACT_BUILD",
    "CostModel",
    "Speed",
    "amx_weights_disabled",
    "build",
    "cache_report",
    "clear_caches",
    "default_threads",
    "draft_verdict",
    "gpu_layers",
    "learned_costs",
    "llamafile_built",
    "lookup_reference",
    "measure_costs",
    "pair_config",
    "recalibrate_pair",
    "requantize",
    "speed",
]


@dataclass(frozen=True)
class Speed:
    """Measured speed of one model: one-token decodes, and one 32-token batch (a verify)."""

    tokens_per_second: float
    batch32_seconds: float
    one_token_seconds: float

    @property
    def batch_ratio(self) -> float:
        """Cost of a 32-token batch in one-token decodes: near 1 on a GPU, far more on a CPU."""
        return self.batch32_seconds / self.one_token_seconds


def speed(path: Path, *, seconds: float = 3.0, threads: int | None = None, gpu_layers: int = 0) -> Speed:
    """Decode greedily one token at a time for about `seconds`, then time one 32-token batch."""
    model = Model(path, n_ctx=512, n_threads=threads, n_gpu_layers=gpu_layers)
    tokens = model.tokenize("The quick brown fox", add_bos=True)
    logits = model.sync(tokens, 1)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds and len(tokens) < 400:
        tokens.append(int(logits[-1].argmax()))
        logits = model.sync(tokens, 1)
        n += 1
    elapsed = time.perf_counter() - t0
    tokens += tokens[-1:] * max(0, 33 - len(tokens))
    model.trim(len(tokens) - 32)
    t1 = time.perf_counter()
    model.sync(tokens, 32)
    return Speed(n / elapsed, time.perf_counter() - t1, elapsed / n)


def pair_config(threads: int | None = None) -> RunConfig:
    """The default pair as `localspec generate` loads it here: the config file's settings, `threads` over them."""
    from localspec.config import load_config

    settings: dict[str, Any] = load_config()
    return run_config(**{n: settings[n] for n in HARDWARE if n in settings} | ({"threads": threads} if threads else {}))


def draft_verdict(cfg: RunConfig) -> str:
    """What `generate` does with cfg's draft model here, as its policy says (the store's entry for cfg's keys)."""
    (target_key, draft_key), (target, draft) = store_keys(cfg), cfg.paths()
    if draft_key is None or draft is None:
        return "no draft model"
    return verdict(store.kept(target_key, draft_key), store.costs(target_key), store.file_bound(target, draft))


def learned_costs(cfg: RunConfig) -> CostModel | None:
    """The verify costs `generate` uses here with cfg; None before any run has learned them."""
    return store.costs(store_keys(cfg)[0])


def recalibrate_pair(cfg: RunConfig) -> None:
    """Measure cfg's pair afresh now and keep that as its learned costs."""
    calibrate(*load_models(replace(cfg, cache_ram=0, cache_disk=0)))


def measure_costs(spec: LocalSpec, pair: RunConfig | None = None) -> CostModel:
    """The decode costs here of a session's target beside `pair`'s draft model (default: the session's), measured
    now where the store lacks them (the draft model loaded for that, then let go): what `localspec bench` prices
    its rows with."""
    return load_costs(spec.engine.target, load_draft(pair or spec.config))


def lookup_reference(
    spec: LocalSpec, tokens: list[int], *, max_tokens: int, sampler: SamplerSettings, seed: int
) -> Iterator[object]:
    """llama-cpp-python's own prompt-lookup drafting on a session's target, loaded now beside it, as `localspec
    bench` compares it: its completion of `tokens`, streamed a step per token."""
    from localspec.llama.bench_lookup import prompt_lookup_llama

    target = spec.engine.target
    llm = prompt_lookup_llama(target.path, n_ctx=len(tokens) + max_tokens + 64, n_threads=target.n_threads)
    steps = llm.create_completion(tokens, max_tokens=max_tokens, **asdict(sampler), seed=seed, stream=True)
    return iter(steps)


def requantize(target: str | None, quant: str) -> Path:
    """The target (a path or catalog name; None: the default pair's) requantized to `quant` (Q8_0, F16, ...),
    made once beside it."""
    src = resolve(target or default_pair()[0].name)
    stem = src.stem.rsplit("-", 1)[0] if "-q" in src.stem.lower() else src.stem
    return requantize_model(src, src.with_name(f"{stem}-{quant.lower()}.gguf"), quant)


def cache_report() -> str:
    """The prompt cache's and the earlier answers' files and budgets (the config file's, else the defaults), one line
    each."""
    from localspec.config import load_config

    settings = {name: load_config().get(name, default(name)) for name in ("cache_ram", "cache_disk", "recall")}
    files, size = folder_usage(prompts_dir())
    answers = sum(p.stat().st_size for p in answers_dir().glob("*.npy")) if answers_dir().is_dir() else 0
    return (
        f"prompt cache: {files} entries, {size / 2**20:.1f} MiB on disk in {prompts_dir()} (budgets: memory "
        f"{settings['cache_ram']} MiB, disk {settings['cache_disk']} MiB)\n"
        f"earlier answers: {answers / 2**20:.2f} MiB in {answers_dir()} (recall {'on' if settings['recall'] else 'off'})"
    )


def clear_caches() -> int:
    """Empty the prompt cache's disk tier and the earlier answers; the bytes freed."""
    freed = clear(prompts_dir())
    for path in answers_dir().glob("*.npy") if answers_dir().is_dir() else []:
        freed += path.stat().st_size
        path.unlink()
    return freed
