"""GGUF header validation, before a file ever reaches llama.cpp (which may crash on a bad one).

Checks the magic, version, every metadata record and tensor record, and that the tensor data
the header declares actually lies inside the file (a truncated download fails here, cleanly).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError

# ggml type id -> (elements per block, bytes per block)
GGML_TYPES = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# llama_ftype (general.file_type) -> the usual quantization name
_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4",
}
_TOKENS = "tokenizer.ggml.tokens"


class BadModelFile(LocalspecError):
    """The file is missing, unreadable or not a valid, complete GGUF model."""


@dataclass
class GGUFInfo:
    """What the header says: scalar metadata, array lengths, and the declared size."""

    version: int
    metadata: dict[str, object] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)
    n_tensors: int = 0
    n_params: int = 0
    declared_size: int = 0
    tokens_raw: bytes | None = None  # the vocabulary's token array as stored, when asked for
    data_start: int = 0  # where the tensor data begins (the header's length, aligned)
    tensors: list[tuple[str, int, int, int]] = field(default_factory=list)  # (name, ggml type, elements, offset)

    @property
    def tokens(self) -> list[str] | None:
        """The vocabulary's token texts (decoded from tokens_raw)."""
        if self.tokens_raw is None:
            return None
        raw, out, pos = self.tokens_raw, [], 0
        while pos < len(raw):
            n = struct.unpack_from("<Q", raw, pos)[0]
            out.append(raw[pos + 8 : pos + 8 + n].decode("utf-8", "replace"))
            pos += 8 + n
        return out

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    @property
    def quantization(self) -> str:
        ftype = self.metadata.get("general.file_type")
        return _FILE_TYPES.get(int(ftype), f"type {ftype}") if isinstance(ftype, int) else "?"

    @property
    def context_length(self) -> int | None:
        """The context the model was trained for, where the header says."""
        n = self.metadata.get(f"{self.architecture}.context_length")
        return n if isinstance(n, int) and n > 0 else None

    @property
    def n_vocab(self) -> int:
        return self.array_lengths.get("tokenizer.ggml.tokens", 0)


class _Reader:
    """Reads the header from a memory map of the file (cheap slices, no per-record file calls)."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf, self.size, self.pos = buf, size, 4  # after the magic

    def take(self, n: int) -> bytes:
        if self.pos + n > self.size:
            raise ValueError("the header ends before its records do")
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > self.size:
            raise ValueError("the header ends before its records do")
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def count(self, what: str) -> int:
        n = self.scalar("<Q")
        if n > self.size:
            raise ValueError(f"implausible {what} ({n:,})")
        return int(n)

    def string(self) -> str:
        return self.take(self.count("string length")).decode("utf-8", "replace")

    def skip_strings(self, n: int) -> None:
        buf, pos, size, unpack = self.buf, self.pos, self.size, struct.Struct("<Q").unpack_from
        for _ in range(n):
            if pos + 8 > size:
                raise ValueError("the header ends before its records do")
            pos += 8 + unpack(buf, pos)[0]
        if pos > size:
            raise ValueError("the header ends before its records do")
        self.pos = pos

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        raise ValueError(f"unknown metadata type {vtype}")


def check_file(path: Path) -> None:
    """Refuse (BadModelFile) a model path that is missing or no file."""
    if not path.exists():
        raise BadModelFile(f"{path}: no such model file (run `localspec models install` for the default pair)")
    if not path.is_file():
        raise BadModelFile(f"{path}: is a directory, not a GGUF model file")


def read_gguf(path: Path, *, tokens: bool = False, header_only: bool = False) -> GGUFInfo:
    """Parse and validate a GGUF header (with the token texts if asked); BadModelFile names the problem.

    `header_only`: the file may end where the header does (its tensor data is not checked for)."""
    path = Path(path)
    check_file(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise BadModelFile(f"{path}: not a GGUF file (bad magic bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Reader(buf, size), path, size, tokens, header_only)
    except OSError as e:
        raise BadModelFile(f"{path}: cannot read ({e.strerror})") from None
    except (ValueError, struct.error) as e:
        raise BadModelFile(f"{path}: corrupt GGUF header: {e}") from None


def _parse(r: _Reader, path: Path, size: int, want_tokens: bool, header_only: bool) -> GGUFInfo:
    version = r.scalar("<I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    info = GGUFInfo(version)
    n_tensors, n_kv = r.count("tensor count"), r.count("metadata count")
    for _ in range(n_kv):
        key, vtype = r.string(), r.scalar("<I")
        if vtype == _ARRAY:
            etype, n = r.scalar("<I"), r.count("array length")
            info.array_lengths[key] = n
            if etype in _SCALARS:
                r.take(struct.calcsize(_SCALARS[etype]) * n)
            elif etype != _STRING:
                raise ValueError(f"unknown array element type {etype}")
            elif key == _TOKENS and want_tokens:
                start = r.pos
                r.skip_strings(n)
                info.tokens_raw = r.buf[start : r.pos]
            else:
                r.skip_strings(n)
        else:
            info.metadata[key] = r.value(vtype)
    end = 0
    for _ in range(n_tensors):
        name, n_dims = r.string(), r.scalar("<I")
        if n_dims > 8:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
        elements = 1
        for _ in range(n_dims):
            elements *= r.scalar("<Q")
        ttype, offset = r.scalar("<I"), r.scalar("<Q")
        info.tensors.append((name, ttype, elements, offset))
        info.n_params += elements
        if ttype in GGML_TYPES:
            block, nbytes = GGML_TYPES[ttype]
            end = max(end, offset + elements // block * nbytes)
    info.n_tensors = n_tensors
    align = info.metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0:
        raise ValueError(f"bad alignment {align!r}")
    info.data_start = data_start = -(-r.pos // align) * align
    info.declared_size = data_start + end
    if info.declared_size > size and not header_only:
        raise BadModelFile(
            f"{path}: truncated: the header declares {info.declared_size:,} bytes, the file has {size:,}"
        )
    return info
