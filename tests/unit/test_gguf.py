"""GGUF header checks and vocabulary comparison on small files written here (no model)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from localspec.models.gguf import BadModelFile, read_gguf
from localspec.models.vocab import mismatch_uncached


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(
    path: Path, tokens: list[str], *, n_tensor_elements: int = 64, magic: bytes = b"GGUF", cut: int | None = None
) -> Path:
    """A minimal GGUF v3: an architecture, a vocabulary and one F32 tensor (with its data)."""
    kv = [
        _string("general.architecture") + struct.pack("<I", 8) + _string("toy"),
        _string("general.file_type") + struct.pack("<I", 4) + struct.pack("<I", 0),
        _string("tokenizer.ggml.tokens")
        + struct.pack("<II", 9, 8)
        + struct.pack("<Q", len(tokens))
        + b"".join(_string(t) for t in tokens),
    ]
    tensor = _string("weight") + struct.pack("<I", 1) + struct.pack("<Q", n_tensor_elements) + struct.pack("<IQ", 0, 0)
    header = magic + struct.pack("<IQQ", 3, 1, len(kv)) + b"".join(kv) + tensor
    header += b"\0" * (-len(header) % 32)
    data = header + b"\0" * (4 * n_tensor_elements)
    path.write_bytes(data[:cut] if cut is not None else data)
    return path


VOCAB = ["<pad>", "a", "b", "hello", " world"]


def test_valid_header(tmp_path: Path) -> None:
    info = read_gguf(write_gguf(tmp_path / "m.gguf", VOCAB), tokens=True)
    assert info.architecture == "toy" and info.quantization == "F32" and info.n_vocab == 5
    assert info.tokens == VOCAB and info.n_params == 64


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (lambda d: d / "missing.gguf", "no such model file"),
        (lambda d: (d / "dir.gguf").mkdir() or d / "dir.gguf", "is a directory"),
        (lambda d: write_gguf(d / "x.gguf", VOCAB, magic=b"GGML"), "bad magic"),
        (lambda d: write_gguf(d / "x.gguf", VOCAB, cut=-100), "truncated"),
        (lambda d: write_gguf(d / "x.gguf", VOCAB, cut=40), "corrupt GGUF header"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, make, expect: str) -> None:
    with pytest.raises(BadModelFile, match=expect):
        read_gguf(make(tmp_path))


def test_vocabularies_compared(tmp_path: Path) -> None:
    target = write_gguf(tmp_path / "t.gguf", [*VOCAB, "<extra>"])  # a padded target
    assert mismatch_uncached(target, write_gguf(tmp_path / "d.gguf", VOCAB)) is None
    other = write_gguf(tmp_path / "o.gguf", ["<pad>", "a", "c", "hello", " world"])
    problem = mismatch_uncached(target, other)
    assert problem is not None and "first differing token is id 2" in problem and "'c'" in problem
    bigger = write_gguf(tmp_path / "b.gguf", [*VOCAB, "<extra>", "<more>"])
    assert "larger" in (mismatch_uncached(target, bigger) or "")
