"""Turning options into loaded models and an engine: defaults, offload, the vocabulary check."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from localspec.core.sampling import SamplerSettings
from localspec.decoding.engine import Engine
from localspec.drafting import draft_model, store
from localspec.drafting.base import REGISTRY, Drafter
from localspec.drafting.copier import Copier
from localspec.drafting.costs import CostModel
from localspec.drafting.draft_model import BackgroundLoad, DraftModelDrafter
from localspec.drafting.policy import DraftPolicy
from localspec.drafting.recall import AnswerStore, Recall
from localspec.errors import LocalspecError
from localspec.llama.model import EXACT_PROBE, Model, exact_rows, gpu_offload_supported, rows_alike
from localspec.llama.prompts import MiB, PromptCache, shared_memory
from localspec.models.catalog import default_pair, resolve
from localspec.models.gguf import check_file, read_gguf
from localspec.models.vocab import mismatch
from localspec.paths import cache_dir
from localspec.settings import TRAINED_CTX_CAP, default

COPIER = ("copier", "ngram")  # --draft values that mean the copier alone ("ngram": its older name)


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
    draft: str = default("draft")  # "auto" (default draft model + the copier), "copier" (or "ngram"), or a model
    no_draft: bool = False
    copier: bool = True  # the copier beside the draft model
    k: int | None = None  # None: the cost-aware choice each round ("auto" in the table)
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    seed: int | None = default("seed")
    ctx: int = default("ctx")  # 0: the target's trained context (with_context)
    threads: int | None = default("threads")
    gpu_layers: int = default("gpu_layers")
    draft_gpu_layers: int = default("draft_gpu_layers")
    flash_attn: bool = default("flash_attn")
    exact: bool = default("exact")  # batches whose logits are one-token decoding's to the bit (llama.model.exact_rows)
    cache_ram: int = default("cache_ram")  # the prompt cache's budgets in MiB (0: no such tier)
    cache_disk: int = default("cache_disk")
    recall: bool = default("recall")  # drafting from earlier answers (drafting.recall)
    drafters: tuple[str, ...] = ()  # registered drafters (localspec.drafting.base.register), tried first
    session: bool = False  # many answers (a chat, a server): the draft model's load is priced over them all

    @property
    def target_alone(self) -> bool:
        return self.no_draft or self.k == 0

    def paths(self) -> tuple[Path, Path | None]:
        t_default, d_default = default_pair()
        target = resolve(self.target or t_default.name)
        check_file(target)  # before the draft is looked for: what is missing is the target
        if self.target_alone or self.draft in COPIER:
            return target, None
        return target, resolve(d_default.name if self.draft == "auto" else self.draft)

    def pinned(self) -> RunConfig:
        """This config with its files found (`paths`) and its context resolved, once: what a command asking several
        things of one pair (its keys, its verdict, its costs) passes on."""
        target, draft = self.paths()
        pinned = replace(self, target=str(target), draft=str(draft) if draft is not None else self.draft)
        return with_context(pinned, target)


def with_context(cfg: RunConfig, target_path: Path) -> RunConfig:
    """cfg with its context in tokens: ctx 0 is the target's trained context, up to TRAINED_CTX_CAP."""
    if cfg.ctx:
        return cfg
    trained = read_gguf(target_path, header_only=True).context_length or default("ctx")
    return replace(cfg, ctx=min(trained, TRAINED_CTX_CAP))


def load_models(cfg: RunConfig) -> tuple[Model, Model | None]:
    """Load target (and draft), refusing (before loading either) a pair whose vocabularies differ."""
    target_path, draft_path = cfg.paths()
    cfg = with_context(cfg, target_path)
    check_pair(target_path, draft_path)
    return _load(cfg, target_path, cfg.gpu_layers), _load(cfg, draft_path, cfg.draft_gpu_layers) if draft_path else None


def load_draft(cfg: RunConfig) -> Model | None:
    """cfg's draft model alone, loaded now (None: cfg has none)."""
    target_path, draft_path = cfg.paths()
    cfg = with_context(cfg, target_path)
    return _load(cfg, draft_path, cfg.draft_gpu_layers) if draft_path else None


def check_pair(target_path: Path, draft_path: Path | None) -> None:
    """Refuse a draft whose vocabulary is not the target's (from the GGUF headers, nothing loaded)."""
    if draft_path is not None and (problem := mismatch(target_path, draft_path)):
        raise LocalspecError(f"draft {draft_path} cannot draft for target {target_path}: {problem}")


def _load(
    cfg: RunConfig, path: Path, layers: int, cancel: threading.Event | None = None, *, check: Path | None = None
) -> Model:
    """The model at `path` as cfg loads it (its vocabulary checked against the target at `check` first)."""
    if check is not None:
        check_pair(check, path)
    model = Model(
        path,
        n_ctx=cfg.ctx,
        n_threads=cfg.threads or default_threads(),
        n_gpu_layers=gpu_layers(layers),
        flash_attn=cfg.flash_attn,
        cancel=cancel,
    )
    if cfg.cache_ram or cfg.cache_disk:
        memory = shared_memory(cfg.cache_ram * MiB)  # one budget for the process: the target's and the draft's
        model.prompts = PromptCache(model.kv_key, ram=memory, disk=cfg.cache_disk * MiB, root=prompts_dir(), warn=_warn)
    return model


def answers_dir() -> Path:
    """Where the answers targets gave are kept (drafting.recall), a file a target."""
    return cache_dir() / "answers"


def answers_path(target: Path) -> Path:
    return answers_dir() / f"{target.stem}-{target.stat().st_size}.npy"


def prompts_dir() -> Path:
    """The prompt cache's disk tier."""
    return cache_dir() / "prompts"


def _warn(text: str) -> None:
    print(text, file=sys.stderr)


def store_keys(cfg: RunConfig) -> tuple[str, str | None]:
    """The cost store's keys of cfg's target and draft model (None: it has none), as load_engine loads them."""
    target_path, draft_path = cfg.paths()
    return _keys(with_context(cfg, target_path), target_path, draft_path)


def _keys(cfg: RunConfig, target_path: Path, draft_path: Path | None) -> tuple[str, str | None]:
    """The store's keys of these files loaded with cfg (its context resolved)."""
    threads = cfg.threads or default_threads()

    def key(path: Path, layers: int) -> str:
        return store.key(path, threads=threads, gpu_layers=gpu_layers(layers), ctx=cfg.ctx)

    return key(target_path, cfg.gpu_layers), key(draft_path, cfg.draft_gpu_layers) if draft_path else None


def load_engine(cfg: RunConfig) -> tuple[Engine, DraftPolicy | None]:
    """Models, costs (for automatic k) and a seeded engine for cfg, with the session's draft-model policy.

    Under automatic k the draft model drafts as its policy says (policy.DraftPolicy: named by the user, used by
    its verdict, explored where it may clearly win, tried within a budget, or skipped) and is loaded beside the
    target's work once its offer would repay its load (a named one from the first round); the policy says why
    where it was left out, and is settled when the session ends (store.settle).
    """
    target_path, draft_path = cfg.paths()
    cfg = with_context(cfg, target_path)
    named = cfg.draft not in ("auto", *COPIER)
    if named:  # a draft the user named is checked at once; the default one before it is loaded
        check_pair(target_path, draft_path)
    t0 = time.perf_counter()
    target = _load(cfg, target_path, cfg.gpu_layers)
    loaded_in = time.perf_counter() - t0
    auto = cfg.k is None and not cfg.target_alone
    target_key, draft_key = _keys(cfg, target_path, draft_path)
    cost = (store.costs(target_key) or CostModel({})) if auto else None
    policy = None
    if draft_path is not None and draft_key is not None and cost is not None:
        keys, paths = (target_key, draft_key), (target_path, draft_path)
        policy = store.decide(keys, paths, cost, loaded_in, named=named, session=cfg.session)
        cost = policy.cost
    drafters = [_registered(name, target) for name in cfg.drafters] + make_drafters(
        target,
        copier=not cfg.target_alone and (cfg.copier or cfg.draft in COPIER) and Copier.name not in cfg.drafters,
        recall=not cfg.target_alone and cfg.recall,
    )
    if draft_path is not None and (policy is None or policy.choice != "skip"):
        # the default draft's vocabulary is checked where it loads (on its load's thread: 0.25 s off a first
        # answer's path, where the check was not kept yet); a named one's was checked above
        loading = partial(_load, cfg, draft_path, cfg.draft_gpu_layers, check=None if named else target_path)
        beside = target if target.on_cpu else None  # on the target's cores, its load takes one of its threads
        drafters += draft_model.drafters(
            loading() if policy is None else loading,
            cost,
            policy=policy,
            path=draft_path,
            background=partial(BackgroundLoad, beside=beside),
        )
    rows = rows_alike(target, exact_rows(target) or EXACT_PROBE) if cfg.exact else None
    engine = Engine(target, drafters, 0 if cfg.target_alone else cfg.k, cost=cost, max_draft=rows and rows - 1)
    return engine, policy


def make_drafters(target: Model, *, copier: bool = False, recall: bool = False) -> list[Drafter]:
    """The built-in drafters of text in the planner's order of preference: n-gram copies, then earlier answers
    (`recall`); a draft model's come after them (draft_model.drafters)."""
    drafters: list[Drafter] = []
    if copier:
        drafters.append(_registered(Copier.name, target))
    if recall:
        drafters.append(Recall(AnswerStore(answers_path(target.path), vocab=target.n_vocab)))
    return drafters


def _registered(name: str, target: Model) -> Drafter:
    if name not in REGISTRY:
        raise LocalspecError(f"no drafter registered as {name!r} (registered: {', '.join(REGISTRY) or 'none'})")
    return REGISTRY[name](target)


def draft_drafter(engine: Engine) -> DraftModelDrafter | None:
    """The engine's drafter of a draft model, if it has one."""
    return next((d for d in engine.drafters if isinstance(d, DraftModelDrafter)), None)


def draft_path_of(engine: Engine) -> Path | None:
    """The file of the draft model an engine drafts with (loaded or not yet), if it has one."""
    drafter = draft_drafter(engine)
    return drafter.path if drafter else None
