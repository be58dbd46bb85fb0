"""Random-weight twins of GGUF models: the same header (shapes, types, vocabulary, chat template), random data.

A decode's cost does not depend on the weights' values, so a twin measures a machine's cost curve as the real
model would, from the header alone (`header_of`: about 5 MB for a 151,936-token vocabulary, where the model is
1.1 GB); `write_twin` fills in the data. scripts/gpu_check.py measures a GPU this way.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

from localspec.files import atomic_path
from localspec.models.gguf import GGML_TYPES, read_gguf

# ggml type -> byte offsets of each block's float16 scales (set small and finite; the rest stays random):
# Q4_0, Q5_0, Q8_0 lead with d; Q4_K and Q5_K with d and dmin; Q2_K ends with d and dmin, Q3_K and Q6_K with d.
_F16_SCALES = {2: (0,), 6: (0,), 8: (0,), 12: (0, 2), 13: (0, 2), 10: (80, 82), 11: (108,), 14: (208,)}
_SCALE = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
_CHUNK = 1 << 24  # elements generated at a time


def header_of(path: Path) -> bytes:
    """The header of a GGUF file: everything before its tensor data."""
    info = read_gguf(path)
    with open(path, "rb") as f:
        return f.read(info.data_start)


def write_twin(header: bytes, out: Path, seed: int = 0) -> Path:
    """Write a model with this header and random weights: float tensors ~N(0, 0.02), quantized blocks random
    with small scales (types without known scale positions are zeros, which cost the same to multiply)."""
    with atomic_path(out) as part:
        part.write_bytes(header)
        info = read_gguf(part, header_only=True)
        rng = np.random.default_rng(seed)
        with open(part, "r+b") as f:
            for _, ttype, elements, offset in sorted(info.tensors, key=lambda t: t[3]):
                f.seek(info.data_start + offset)
                _fill(f, rng, ttype, elements)
            f.truncate(info.declared_size)
    read_gguf(out)  # complete and valid
    return out


def _fill(f: BinaryIO, rng: np.random.Generator, ttype: int, elements: int) -> None:
    block, nbytes = GGML_TYPES[ttype]
    if ttype in (0, 1):  # F32, F16
        dtype = np.float32 if ttype == 0 else np.float16
        for start in range(0, elements, _CHUNK):
            f.write((rng.standard_normal(min(_CHUNK, elements - start), np.float32) * 0.02).astype(dtype).tobytes())
        return
    blocks, per_chunk = elements // block, max(1, _CHUNK // block)
    for start in range(0, blocks, per_chunk):
        n = min(per_chunk, blocks - start)
        if ttype not in _F16_SCALES:
            f.write(bytes(n * nbytes))
            continue
        data = rng.integers(0, 256, (n, nbytes), np.uint8)
        for at in _F16_SCALES[ttype]:
            data[:, at : at + 2] = _SCALE
        f.write(data.tobytes())
