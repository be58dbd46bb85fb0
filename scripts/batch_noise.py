"""How far batched decoding moves the target's top-two logit gap from one-token decoding (the near-tie bound).

    python scripts/batch_noise.py --tokens 60
    GGML_CPU_TILED_MM=0 python scripts/batch_noise.py --target models/qwen2.5-coder-1.5b-instruct-q8_0.gguf
    python scripts/batch_noise.py --exact     # with llama-cpp-python built with CMAKE_ARGS=-DGGML_LLAMAFILE=OFF

Each prompt's greedy answer is decoded one token at a time, then again in verify-like batches (the whole
answer, 8 and 3 at a time, after the prompt whole or split); at every position the change of the gap
between the one-token path's top two tokens is recorded. Tests call outputs that part at a gap below
tests/support/same.py's NEAR_TIE a near tie, so NEAR_TIE must sit above this distribution's tail.
"""

from __future__ import annotations

import argparse

import numpy as np

from localspec.api import LocalSpec

PROMPTS = [f"Name one use of the number {n}, in one short sentence." for n in (2, 5, 9, 17, 64)] + [
    "Write a Python function that merges two sorted lists."
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=60)
    ap.add_argument("--target", default=None, help="a GGUF file (default: the default pair's target)")
    ap.add_argument("--chunks", default="all,8,3", help="verify batch sizes, comma-separated ('all': the whole answer)")
    ap.add_argument("--exact", action="store_true", help="exact batches (--exact): batches as that mode caps them")
    args = ap.parse_args()
    spec = LocalSpec.load(args.target, no_draft=True, exact=args.exact)
    m, cap = spec.engine.target, spec.engine.max_draft
    # The exact mode makes a verify batch compute what one-token decoding does after the same prefill; a prompt
    # prefilled in other pieces (another history's cache) is another prefill, so it is left out there.
    splits = (0,) if args.exact else (0, None)
    moved: list[float] = []
    rows_apart = 0  # positions whose logits differ at all
    for text in PROMPTS:
        prompt = spec.tokens([{"role": "user", "content": text}])
        m.reset()
        answer: list[int] = []
        single = [m.sync(prompt, 1)[0].copy()]
        for _ in range(args.tokens):
            answer.append(int(single[-1].argmax()))
            single.append(m.sync(prompt + answer, 1)[0].copy())
        for split in [len(prompt) - 7 if s is None else s for s in splits]:
            for chunk in [len(answer) if c == "all" else int(c) for c in args.chunks.split(",")]:
                chunk = chunk if cap is None else min(chunk, cap + 1)
                m.reset()
                if split:
                    m.sync(prompt[:split], 1)
                m.sync(prompt, 1)
                rows = [
                    m.sync(prompt + answer[: s + chunk], min(chunk, len(answer) - s)).copy()
                    for s in range(0, len(answer), chunk)
                ]
                batched = np.concatenate(rows)  # row j - 1 predicts answer[j]
                for j in range(1, len(answer)):
                    one, many = single[j], batched[j - 1]
                    a, b = np.argsort(one)[-2:][::-1]
                    moved.append(abs(float((one[a] - one[b]) - (many[a] - many[b]))))
                    rows_apart += not np.array_equal(one, many)
    q = np.percentile(moved, [50, 90, 99, 99.9])
    print(
        f"{len(moved)} positions: the top-two gap moved by median {q[0]:.3f}, p90 {q[1]:.3f}, p99 {q[2]:.3f}, "
        f"p99.9 {q[3]:.3f}, max {max(moved):.3f} logits; {rows_apart} positions' logits differ at all"
    )


if __name__ == "__main__":
    main()
