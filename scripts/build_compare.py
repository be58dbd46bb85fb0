"""The kernels' speed of this process's llama.cpp build, for a stock against a -DGGML_LLAMAFILE=OFF comparison.

    python scripts/build_compare.py --target models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    PYTHONPATH=/path/to/exact-build python scripts/build_compare.py ...   # the other build's llama_cpp first

Prints one JSON line: the build (LLAMAFILE in its system info or not), prefill tokens per second at each prompt
length, a one-token decode's milliseconds, and a verify batch's milliseconds at 2-7 rows (each row's logits
asked for, as verification asks), every figure the median of --runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from localspec.decoding.loader import default_threads
from localspec.llama.model import Model, llamafile_built

FILLER = "def add(a, b):\n    return a + b\n\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--prefill", default="64,512,2048")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    lengths = [int(n) for n in args.prefill.split(",")]
    model = Model(args.target, n_ctx=max(lengths) + 64, n_threads=default_threads())
    text = model.tokenize(FILLER * (max(lengths) // 8 + 8))
    out: dict[str, object] = {"target": args.target, "llamafile": llamafile_built()}
    prefill = {}
    for n in lengths:
        times = []
        for _ in range(args.runs):
            model.reset()
            t0 = time.perf_counter()
            model.sync(text[:n], 1)
            times.append(time.perf_counter() - t0)
        prefill[n] = n / statistics.median(times)
    out["prefill_tokens_per_second"] = prefill
    base = text[:256]
    batches = {}
    for rows in range(1, 8):
        times = []
        for i in range(args.runs * 4):
            model.sync(base, 1)  # the context, then `rows` new tokens in one batch
            t0 = time.perf_counter()
            model.sync(base + text[256 + i : 256 + i + rows], rows)
            times.append(time.perf_counter() - t0)
            model.trim(len(base))
        batches[rows] = statistics.median(times) * 1e3
    out["batch_ms"] = batches
    print(json.dumps(out))


if __name__ == "__main__":
    main()
