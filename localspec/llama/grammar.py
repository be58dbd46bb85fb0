"""The target's vocabulary as llguidance reads it, for grammar masks.

Reading 151k token pieces through ctypes takes about two seconds, so the pieces are kept on disk
per model file (a few MB, read back in milliseconds).
"""

from __future__ import annotations

import ctypes
import hashlib
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from localspec.files import atomic_file, set_aside
from localspec.llama.model import Model
from localspec.paths import cache_dir

if TYPE_CHECKING:  # llguidance is imported where a grammar is first used
    from llguidance import LLTokenizer

_SPECIAL = b"\xff"  # llguidance's mark for a special token: matched only by name (<[id]>), never as text


def _pieces(model: Model) -> tuple[list[bytes], list[int]]:
    """Every token's bytes (special tokens marked) and the end-of-generation tokens."""
    vocab, pieces, eog = model._vocab, [], []
    buf = ctypes.create_string_buffer(1024)
    for tok in range(model.n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, True)
        piece = buf.raw[: max(n, 0)]
        attr = llama_cpp.llama_vocab_get_attr(vocab, tok)
        user_markup = attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or user_markup:
            piece = _SPECIAL + piece
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            eog.append(tok)
        pieces.append(piece)
    return pieces, eog


def vocab_cache(model: Model) -> Path:
    """Where the model's pieces are kept (by its file, size and time)."""
    st = model.path.stat()
    key = hashlib.sha256(f"{model.path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]
    return cache_dir() / "grammar-vocab" / f"{key}.npz"


def _cached_pieces(model: Model) -> tuple[list[bytes], list[int]]:
    path = vocab_cache(model)
    try:
        with np.load(path) as f:
            blob, ends, eog = f["blob"].tobytes(), f["ends"].tolist(), f["eog"].tolist()
        starts = [0, *ends[:-1]]
        pieces = [blob[a:b] for a, b in zip(starts, ends, strict=True)]
        if len(pieces) == model.n_vocab:
            return pieces, eog
        set_aside(path)
    except FileNotFoundError:
        pass
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):  # truncated, empty, not an archive
        set_aside(path)
    pieces, eog = _pieces(model)
    try:
        with atomic_file(path, "wb") as f:
            blob = np.frombuffer(b"".join(pieces), np.uint8)
            np.savez(f, blob=blob, ends=np.cumsum([len(p) for p in pieces]), eog=np.array(eog, np.int64))
    except OSError as e:
        print(f"localspec: could not write {path} ({e}); it is rebuilt next time", file=sys.stderr)
    return pieces, eog


def grammar_tokenizer(model: Model) -> LLTokenizer:
    """The model's vocabulary for llguidance (built once per model; the pieces cached on disk)."""
    from llguidance import LLTokenizer

    if model.grammar_tokenizer is None:
        pieces, eog = _cached_pieces(model)
        fptr = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        model.grammar_tokenizer = LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
            tokens=pieces, vocab_ptr=model._vocab, tokenize_fptr=fptr, eos_token=eog
        )
    return model.grammar_tokenizer
