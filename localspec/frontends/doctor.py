"""`localspec doctor`: the llama.cpp build, the models here, the default pair, and a speed probe."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from localspec.drafting.calibration import cached_costs, file_bound, kept, model_key
from localspec.drafting.policy import verdict
from localspec.errors import LocalspecError
from localspec.llama.model import EXACT_BUILD, Model, gpu_offload_supported, llamafile_built
from localspec.settings import default


@dataclass
class Probe:
    """Measured speed of one model: one-token decodes, and one 32-token batch (a verify)."""

    tokens_per_second: float
    batch32_seconds: float
    one_token_seconds: float

    @property
    def batch_ratio(self) -> float:
        """Cost of a 32-token batch in one-token decodes: near 1 on a GPU, far more on a CPU."""
        return self.batch32_seconds / self.one_token_seconds


def probe(path: Path, *, seconds: float = 3.0, threads: int | None = None, gpu_layers: int = 0) -> Probe:
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
    return Probe(n / elapsed, time.perf_counter() - t1, elapsed / n)


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


def learned_curve(target: Path, draft: Path, threads: int, ctx: int = default("ctx")) -> str:
    """The verify costs `generate` uses here (default settings), one line: what the probe is compared with."""
    cost = cached_costs(_keys(target, draft, threads, ctx)[0])
    if cost is None:
        return "learned costs: none yet"
    sizes = ", ".join(f"{n}: {cost.verify_cost(n) * 1e3:.0f}" for n in (1, 2, 4, 8, 16, 32, 64))
    return f"learned verify costs in ms (tokens: ms) {sizes}"


def run_doctor(*, seconds: float, threads: int | None, recalibrate: bool) -> None:
    """Print the build, the models here, the default pair's verdict and learned costs, and each model's speed."""
    from localspec.decoding.loader import default_threads, gpu_layers
    from localspec.llama.model import amx_weights_disabled, build
    from localspec.models.catalog import default_pair, resolve
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
    entries = find_models()
    print(f"models: {len(entries)} found")
    for e in entries:
        print(
            f"  {e.name} ({e.where}): "
            + (f"{e.info.architecture} {e.info.quantization}, {e.role}" if e.info else e.problem)
        )
    t_model, d_model = default_pair()
    n_threads = threads or default_threads()
    try:
        t, d = resolve(t_model.name), resolve(d_model.name)
        problem = mismatch(t, d)
        print(f"default pair {t_model.name} + {d_model.name}: {problem if problem else 'compatible'}")
        if recalibrate and not problem:
            from localspec.api import run_config
            from localspec.decoding.loader import load_models
            from localspec.drafting.calibration import calibrate

            calibrate(*load_models(run_config(threads=n_threads)))
            print("recalibrated: the learned costs were replaced by a fresh measurement")
        print(f"draft model here: {draft_verdict(t, d, n_threads)}")
        print(learned_curve(t, d, n_threads))
    except LocalspecError as e:
        print(f"default pair: {e}")
    for entry in [e for e in entries if e.info]:
        r = probe(entry.path, seconds=seconds, threads=n_threads, gpu_layers=gpu_layers(-1))
        print(
            f"speed {entry.name}: {r.tokens_per_second:.1f} tok/s one token at a time; a 32-token batch costs "
            f"{r.batch32_seconds * 1e3:.0f} ms = {r.batch_ratio:.1f} single decodes "
            f"({'flat: long model drafts pay' if r.batch_ratio < 4 else 'compute-bound: n-gram drafts pay most'})"
        )
