"""`localspec doctor`: the llama.cpp build, the models here, the default pair, and a speed probe."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from localspec.llama.model import Model, gpu_offload_supported


@dataclass
class Build:
    """What this llama-cpp-python build can do."""

    version: str
    system_info: str
    gpu_offload: bool

    @property
    def backends(self) -> list[str]:
        """Backends named in llama.cpp's system info (CPU always; CUDA, Metal, Vulkan … when built in)."""
        names = re.findall(r"(?:^|\| )([A-Za-z][\w-]*) : ", self.system_info)
        return list(dict.fromkeys(names)) or ["CPU"]


def build() -> Build:
    """This process's llama.cpp build."""
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    return Build(llama_cpp.__version__, info, gpu_offload_supported())


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
