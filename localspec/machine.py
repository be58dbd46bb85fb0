"""The machine and the pair here, as `localspec doctor` reports them: the llama.cpp build, what the cost store
has learned, the draft model's verdict, and a speed probe of a model file.

Beside the API (localspec.api) at the facade's level: frontends read the machine here, never below it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from localspec.api import run_config
from localspec.decoding.loader import answers_dir, default_threads, gpu_layers, load_models, prompts_dir
from localspec.drafting.calibration import cached_costs, calibrate, file_bound, kept, model_key
from localspec.drafting.costs import CostModel
from localspec.drafting.policy import verdict
from localspec.llama.model import (
    EXACT_BUILD,
    Model,
    amx_weights_disabled,
    build,
    gpu_offload_supported,
    llamafile_built,
)
from localspec.llama.prompts import clear, folder_usage
from localspec.settings import default

__all__ = [
    "EXACT_BUILD",
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
    "recalibrate_pair",
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


def _keys(target: Path, draft: Path, threads: int, ctx: int) -> tuple[str, str]:
    layers = 999 if gpu_offload_supported() else 0
    return (
        model_key(target, threads=threads, gpu_layers=layers, ctx=ctx),
        model_key(draft, threads=threads, gpu_layers=layers, ctx=ctx),
    )


def draft_verdict(target: Path, draft: Path, threads: int, ctx: int = default("ctx")) -> str:
    """What `generate` does with the draft model here, as its policy says (default settings)."""
    keys = _keys(target, draft, threads, ctx)
    return verdict(kept(*keys), cached_costs(keys[0]), file_bound(target, draft))


def learned_costs(target: Path, draft: Path, threads: int, ctx: int = default("ctx")) -> CostModel | None:
    """The verify costs `generate` uses here (default settings); None before any run has learned them."""
    return cached_costs(_keys(target, draft, threads, ctx)[0])


def recalibrate_pair(threads: int) -> None:
    """Measure the default pair afresh now and keep that as its learned costs."""
    calibrate(*load_models(run_config(threads=threads, cache_ram=0, cache_disk=0)))


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
