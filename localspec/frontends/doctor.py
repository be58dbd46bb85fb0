"""`localspec doctor`: the llama.cpp build, the models here, the default pair, and a speed test."""

from __future__ import annotations

from localspec.api import RunConfig
from localspec.errors import LocalspecError
from localspec.machine import (
    EXACT_BUILD,
    amx_weights_disabled,
    build,
    cache_report,
    default_threads,
    draft_verdict,
    gpu_layers,
    learned_costs,
    llamafile_built,
    pair_config,
    recalibrate_pair,
    speed,
)


def learned_curve(cfg: RunConfig) -> str:
    """The verify costs `generate` uses here with cfg, one line: what the speed test is compared with."""
    cost = learned_costs(cfg)
    if cost is None:
        return "learned costs: none yet"
    sizes = ", ".join(f"{n}: {cost.verify_cost(n) * 1e3:.0f}" for n in (1, 2, 4, 8, 16, 32, 64))
    line = f"learned verify costs in ms (tokens: ms) {sizes}"
    if cost.host_round:
        line += (
            f"\nlearned host time outside llama_decode in ms: {cost.host_round * 1e3:.3f} a round, "
            f"{cost.host_position * 1e3:.3f} a sampled position, "
            + (f"{cost.host_draft * 1e3:.3f} a draft-model token" if cost.host_draft else "no draft-model token yet")
            + f" ({cost.alone / cost.verify_cost(1) - 1:.1%} of a token of the target alone)"
        )
    return line


def run_doctor(*, seconds: float, threads: int | None, recalibrate: bool) -> None:
    """Print the build, the models here, the default pair's verdict and learned costs, and each model's speed."""
    from localspec.models.catalog import default_pair
    from localspec.models.inventory import find_models
    from localspec.models.vocab import mismatch

    b = build()
    print(
        f"llama-cpp-python {b.version}; backends: {', '.join(b.backends)}; GPU offload: "
        f"{'yes' if b.gpu_offload else 'no (a CPU build: see docs/gpu.md for CUDA and Metal builds)'}"
    )
    print(f"system info: {b.system_info}")
    print(
        "exact batches (--exact): "
        + (
            f"not with this build (llamafile's kernels are in): {EXACT_BUILD}"
            if llamafile_built()
            else "available on the CPU"
        )
    )
    if amx_weights_disabled():
        print(
            "AMX: weights kept in plain CPU buffers (llama.cpp's AMX path crashes on some CPUs: ggml-org/llama.cpp#20824)"
        )
    print(cache_report())
    entries = find_models()
    print(f"models: {len(entries)} found")
    for e in entries:
        print(
            f"  {e.name} ({e.where}): "
            + (f"{e.info.architecture} {e.info.quantization}, {e.role}" if e.info else e.problem)
        )
    t_model, d_model = default_pair()
    cfg = pair_config(threads)
    n_threads = cfg.threads or default_threads()
    try:
        cfg = cfg.pinned()  # the pair's files and context found once, for every line below
        t, d = cfg.paths()
        problem = mismatch(t, d) if d is not None else None
        print(f"default pair {t_model.name} + {d_model.name}: {problem if problem else 'compatible'}")
        if recalibrate and not problem:
            recalibrate_pair(cfg)
            print("recalibrated: the learned costs were replaced by a fresh measurement")
        print(f"draft model here: {draft_verdict(cfg)}")
        print(learned_curve(cfg))
    except LocalspecError as e:
        print(f"default pair: {e}")
    for entry in [e for e in entries if e.info]:
        r = speed(entry.path, seconds=seconds, threads=n_threads, gpu_layers=gpu_layers(-1))
        print(
            f"speed {entry.name}: {r.tokens_per_second:.1f} tok/s one token at a time; a 32-token batch costs "
            f"{r.batch32_seconds * 1e3:.0f} ms = {r.batch_ratio:.1f} single decodes "
            f"({'flat: long model drafts pay' if r.batch_ratio < 4 else 'compute-bound: n-gram drafts pay most'})"
        )
