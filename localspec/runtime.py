"""Turning options into loaded models and an engine: defaults, offload, the vocabulary check."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from localspec.catalog import default_pair, resolve
from localspec.costs import load_costs
from localspec.engine import Engine
from localspec.errors import LocalspecError
from localspec.model import Model, gpu_offload_supported
from localspec.sampling import SamplerSettings
from localspec.vocab import mismatch


def default_threads() -> int:
    """All available cores on small machines, half of them (roughly the physical cores) on big ones."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return n if n <= 4 else n // 2


def gpu_layers(requested: int) -> int:
    """-1 means: every layer when this llama.cpp build can offload, else none."""
    if requested >= 0:
        return requested
    return 999 if gpu_offload_supported() else 0


@dataclass
class RunConfig:
    """Everything needed to load a model pair and sample from it."""

    target: str | None = None
    draft: str = "auto"  # "auto" (default draft model + n-gram), "ngram", or a draft model
    no_draft: bool = False
    ngram: bool = True  # n-gram proposals beside the draft model
    k: int | None = None  # None: the cost-aware choice each round
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    seed: int | None = None
    ctx: int = 4096
    threads: int | None = None
    gpu_layers: int = -1
    draft_gpu_layers: int = -1
    flash_attn: bool = False

    @property
    def target_alone(self) -> bool:
        return self.no_draft or self.k == 0

    def paths(self) -> tuple[Path, Path | None]:
        t_default, d_default = default_pair()
        target = resolve(self.target or t_default.name)
        if self.target_alone or self.draft == "ngram":
            return target, None
        return target, resolve(d_default.name if self.draft == "auto" else self.draft)

    def resolved_seed(self) -> int:
        if self.seed is None:
            self.seed = secrets.randbelow(2**31)
        return self.seed


def load_models(cfg: RunConfig) -> tuple[Model, Model | None]:
    """Load target (and draft), refusing (before loading either) a pair whose vocabularies differ."""
    target_path, draft_path = cfg.paths()
    if draft_path is not None and (problem := mismatch(target_path, draft_path)):
        raise LocalspecError(f"draft {draft_path} cannot draft for target {target_path}: {problem}")
    threads = cfg.threads or default_threads()

    def load(path: Path, layers: int) -> Model:
        return Model(path, n_ctx=cfg.ctx, n_threads=threads, n_gpu_layers=gpu_layers(layers),
                     flash_attn=cfg.flash_attn)
    return load(target_path, cfg.gpu_layers), load(draft_path, cfg.draft_gpu_layers) if draft_path else None


def load_engine(cfg: RunConfig) -> Engine:
    """Models, measured costs (for automatic k) and a seeded engine for cfg."""
    target, draft = load_models(cfg)
    ngram = not cfg.target_alone and (cfg.ngram or cfg.draft == "ngram")
    cost = load_costs(target, draft) if cfg.k is None and not cfg.target_alone else None
    return Engine(target, draft, cfg.sampler, 0 if cfg.target_alone else cfg.k, cfg.resolved_seed(),
                  ngram=ngram, cost=cost)
