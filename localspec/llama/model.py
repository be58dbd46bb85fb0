"""llama.cpp plumbing: one GGUF model whose KV cache localspec tracks token by token.

`sync(tokens, n_logits)` makes the cache hold `tokens` (reusing the longest cached prefix, from the live
cache or a prompt cache's entry, trimming the rest with llama_memory_seq_rm) and returns logits for the last
n_logits positions only: there is never an n_ctx x n_vocab logits buffer.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from localspec.core import meter
from localspec.errors import LocalspecError, Unsupported
from localspec.files import atomic_path, locked
from localspec.llama.prompts import PromptCache
from localspec.models.gguf import read_gguf
from localspec.settings import default


@llama_cpp.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Keep llama.cpp's own logging off the user's terminal."""


llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p())


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


@functools.cache
def build_id() -> str:
    """This llama.cpp build's identity beyond llama-cpp-python's version: its features (llamafile's kernels or not,
    the backends) and its library's size, so builds of one version with other kernels never share cached states."""
    library = Path(getattr(llama_cpp.llama_cpp._lib, "_name", "") or ".")
    size = library.stat().st_size if library.is_file() else 0
    return hashlib.sha256(f"{build().system_info}|{size}".encode()).hexdigest()[:16]


class ContextFull(LocalspecError):
    """The token sequence does not fit the model's context window."""


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU (CUDA, Metal, Vulkan …)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def amx_weights_disabled() -> bool:
    """Whether localspec keeps weights out of llama.cpp's AMX buffers on this machine.

    On some AMX (Sapphire Rapids class) CPUs a native build of llama.cpp segfaults in
    ggml_backend_amx_mul_mat at the first decode of a Q4_K model (ggml-org/llama.cpp#20824),
    so where the build uses AMX, localspec loads the weights without llama.cpp's extra
    (repacked) buffer types.
    """
    return "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode("utf-8", "replace")


class Cancelled(LocalspecError):
    """A model's load was cancelled before it finished (nothing of it is kept)."""


_DEFAULT_PARAMS = llama_cpp.llama_cpp.llama_model_default_params
# llama_get_logits answering an address (llama_cpp's binding answers a pointer, and casting it costs more than the
# call): a function object of its own, so the binding's is left as it is.
_logits_address = type(llama_cpp.llama_cpp._lib.llama_get_logits)(("llama_get_logits", llama_cpp.llama_cpp._lib))
_logits_address.restype, _logits_address.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
_LOADING = threading.local()  # this thread's construction: its model parameters' changes


def _model_params() -> llama_cpp.llama_model_params:
    """llama.cpp's model defaults, changed as this thread's construction asks (llama_cpp.Llama reads its defaults
    from the module: a patch read per thread leaves a construction on another thread alone)."""
    p = _DEFAULT_PARAMS()
    if getattr(_LOADING, "amx", False):
        p.use_extra_bufts = False
    callback = getattr(_LOADING, "callback", None)
    if callback is not None:
        p.progress_callback = callback
    return p


llama_cpp.llama_cpp.llama_model_default_params = _model_params


def new_llama(*, cancel: threading.Event | None = None, **kwargs: Any) -> llama_cpp.Llama:
    """llama_cpp.Llama(**kwargs), with weights kept out of AMX buffers where amx_weights_disabled(), and a load
    that stops (Cancelled) once `cancel` is set: llama.cpp asks its progress callback as it reads tensors."""
    _LOADING.amx = amx_weights_disabled()
    _LOADING.callback = (
        llama_cpp.llama_progress_callback(lambda progress, data: not cancel.is_set()) if cancel is not None else None
    )
    try:
        return llama_cpp.Llama(**kwargs)
    except ValueError:
        if cancel is not None and cancel.is_set():
            raise Cancelled("the load was cancelled") from None
        raise
    finally:
        _LOADING.amx, _LOADING.callback = False, None


# Exact batches. ggml's CPU backend computes a row of a batch as a batch of one computes it where both take
# the same kernel: one per output element, summing in one order. Two paths break that: llamafile's tinyBLAS
# (ggml-cpu.c's mul_mat tries it first; sgemm.cpp takes any batch of 2 rows or more, in F32, F16, BF16, Q8_0,
# Q4_0 ... and the F16 attention products): a build option, GGML_LLAMAFILE; and the tiled K-quant matmul
# (tiled/tiled.cpp: K-quant and IQ weights, batches of 8 rows or more). Flash attention has its own paths by
# batch size (ops.cpp: a split-KV pass for one row, tiles for many). What stays is exact to the bit.
TILED_TYPES = frozenset({10, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 29})  # ggml's Q2_K..Q6_K and IQ types
TILED_MIN_ROWS = 8
# A prompt cache's entry is restored where it spares decoding at least this many tokens (a restore costs about
# what decoding a few tokens does), and kept where it holds at least MIN_KEPT.
MIN_RESTORED = 32
MIN_KEPT = 128
PREFILL_TILE = 16  # rows: a multiple of every batched kernel's tile (Model.sync)
EXACT_BUILD = 'CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" pip install --force-reinstall --no-cache-dir llama-cpp-python'


def llamafile_built() -> bool:
    """Whether this llama.cpp build has llamafile's tinyBLAS kernels (no exact batches then)."""
    return "LLAMAFILE = 1" in build().system_info


def exact_rows(model: Model) -> int | None:
    """The most tokens a batch of `model`'s may hold for every row's logits to equal, to the bit, what
    one-token decoding gives (None: any batch); Unsupported (param "exact") where it cannot be exact."""
    if llamafile_built():
        raise Unsupported(
            f"exact batches need llama-cpp-python built without llamafile's kernels: {EXACT_BUILD}", "exact"
        )
    if model.n_gpu_layers > 0 and build().gpu_offload:
        raise Unsupported(
            "exact batches are for the CPU backend: add --gpu-layers 0 (and --draft-gpu-layers 0)", "exact"
        )
    if model.flash_attn:
        raise Unsupported("exact batches leave flash attention off (its kernels differ by batch size)", "exact")
    return TILED_MIN_ROWS - 1 if model.tensor_types & TILED_TYPES else None


EXACT_PROBE = 17  # the largest batch exact mode checks where no rule caps it (a draft model's longest, and its row)
_PROBE_TEXT = "def add(a, b):\n    return a + b\n\n\ndef scale(items, k):\n    return [k * x for x in items]\n" * 3


def rows_alike(model: Model, limit: int) -> int:
    """The most rows (at most `limit`) whose batches compute every row's logits to the bit as one-token decodes
    do, measured on this machine: a CPU's repacked weights, say, take another kernel from a batch of 4 rows on
    some CPUs and not on others, which no reading of the build can tell. A short text decoded a token at a
    time, then in batches of 2, 3, ... rows until one differs; the cache is left empty."""
    text = model.tokenize(_PROBE_TEXT)
    base, new = text[:16], text[16 : 16 + limit]
    model.reset()
    model.sync(base, 1)
    one = [model.sync(base + new[: i + 1], 1)[0].copy() for i in range(len(new))]
    alike = 1
    for rows in range(2, len(new) + 1):
        model.trim(len(base))
        if not np.array_equal(model.sync(base + new[:rows], rows), np.stack(one[:rows])):
            break
        alike = rows
    model.reset()
    return alike


class Model:
    """A GGUF model with a tracked KV cache (sequence 0)."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int = default("ctx"),
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        n_batch: int = 512,
        flash_attn: bool = False,
        cancel: threading.Event | None = None,
    ) -> None:
        """Load the model at `path` (LocalspecError naming what is wrong with the file; Cancelled once `cancel` is
        set while it loads)."""
        n_batch = min(n_batch, n_ctx)  # llama.cpp caps a batch at the context; a larger one aborts natively
        try:
            self.llm = new_llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_ubatch=n_batch,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                n_gpu_layers=n_gpu_layers,
                flash_attn=flash_attn,
                # On CPU llama.cpp repacks the weights into its own buffers, and mmap would then hold a
                # second copy of them in RSS; without the repacked buffers (AMX machines) the mapped file is
                # the only copy, and a load maps it instead of reading it (Q8_0 1.5B: 1.54 -> 0.36 s warm).
                use_mmap=n_gpu_layers > 0 or amx_weights_disabled(),
                logits_all=False,
                verbose=False,
                cancel=cancel,
            )
        except Cancelled:
            raise
        except (ValueError, RuntimeError) as e:
            read_gguf(path)  # what is wrong with the file, where its header tells (BadModelFile)
            raise LocalspecError(f"{path}: llama.cpp could not load the model ({e})") from None
        self.path = Path(path)
        self.n_threads, self.n_gpu_layers, self.flash_attn = n_threads, n_gpu_layers, flash_attn
        self.name = self.path.name
        self.n_batch = n_batch
        self.n_ctx = self.llm.n_ctx()  # llama.cpp may round the asked-for context up ...
        self.n_ctx_asked = n_ctx  # ... so settings (the cost cache's keys) use this one
        self.n_vocab = self.llm.n_vocab()
        self._ctx = self.llm._ctx.ctx
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = self.llm._model.vocab
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.tokens: list[int] = []  # the KV cache holds exactly these, at positions 0..len-1
        self.n_decoded = 0  # tokens decoded over the model's life (prefill accounting)
        self.grammar_tokenizer: Any = None  # llguidance's view of the vocabulary (llama.grammar), built on first use
        self._pieces: dict[int, bytes] = {}  # each token's bytes, as they are first asked for
        self._eog: dict[int, bool] = {}  # whether a token ends a generation, as it is first asked
        self.prompts: PromptCache | None = None  # states kept by prefix (llama.prompts), when given
        self.cache_miss: str | None = None  # why the last prompt reused less than the caches held (PromptCache.missed)
        self._kept = 0  # how many of the tracked tokens the prompt cache holds a state for
        self._untracked = False  # whether the cache may hold positions past `tokens` (an interrupted decode's)
        self._views: dict[tuple[int, int], np.ndarray] = {}  # views of llama.cpp's logits buffer, by address and rows

    @functools.cached_property
    def tensor_types(self) -> frozenset[int]:
        """The ggml types of its weights, from the file's header (read when first asked: about 0.1 s)."""
        return frozenset(ttype for _, ttype, _, _ in read_gguf(self.path).tensors)

    @property
    def kv_key(self) -> dict[str, Any]:
        """What a cached state of this model depends on: the file, the build, and the settings that shape the cache."""
        st = self.path.stat()
        return {
            "file": self.path.name,
            "bytes": st.st_size,
            "mtime": st.st_mtime_ns,
            "llama_cpp": llama_cpp.__version__,
            "build": build_id(),
            "n_ctx": self.n_ctx,
            "gpu_layers": self.n_gpu_layers,
            "flash_attn": self.flash_attn,
        }

    def close(self) -> None:
        """Free the model's weights, context and batch now (it is of no use after)."""
        batch = getattr(self, "_batch", None)
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
            self._batch = None
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
        self._views = {}  # views of a buffer freed with the context

    def __del__(self) -> None:
        batch = getattr(self, "_batch", None)
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
            self._batch = None

    @property
    def on_cpu(self) -> bool:
        """Whether its decodes run on the CPU's cores (no layer offloaded to a GPU)."""
        return self.n_gpu_layers <= 0 or not gpu_offload_supported()

    def use_threads(self, n: int | None = None) -> None:
        """Decode with `n` threads from now on (None: the ones it was loaded with)."""
        n = n or self.n_threads or 1
        llama_cpp.llama_set_n_threads(self._ctx, n, n)

    # ---- tokens and text --------------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        """Text -> token ids. special=False treats control-token text as plain text."""
        return self.llm.tokenize(text.encode("utf-8", "surrogatepass"), add_bos=add_bos, special=special)

    def piece(self, token: int) -> bytes:
        """The bytes a token contributes to the output (control tokens contribute none)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self.llm.detokenize([token], special=False)
        return piece

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text of a token (for comparing vocabularies)."""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def _text(self, tokens: Iterable[int]) -> str:
        return b"".join(self.piece(int(t)) for t in tokens).decode(errors="replace")

    def is_eog(self, token: int) -> bool:
        """End-of-generation token (EOS, EOT, <|im_end|> …)."""
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return eog

    def fim_tokens(self) -> tuple[int, int, int]:
        """The fill-in-the-middle tokens (prefix, suffix, middle); -1 where the vocabulary has none."""
        v = self._vocab
        return llama_cpp.llama_vocab_fim_pre(v), llama_cpp.llama_vocab_fim_suf(v), llama_cpp.llama_vocab_fim_mid(v)

    @property
    def metadata(self) -> dict[str, str]:
        return self.llm.metadata

    # ---- the KV cache -----------------------------------------------------------------------
    def trim(self, n: int) -> None:
        """Keep only the first n cached positions (anything past the tracked ones too: an interrupted decode's)."""
        if n > len(self.tokens) or (n == len(self.tokens) and not self._untracked):
            return
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1):
            raise LocalspecError(f"{self.name}: llama.cpp cannot trim this model's cache")
        del self.tokens[n:]
        self._kept, self._untracked = min(self._kept, n), False

    def reset(self) -> None:
        """Empty the cache."""
        self.trim(0)

    def sync(
        self, tokens: list[int], n_logits: int = 1, skip: Sequence[bool] = (), *, prompt: bool = False
    ) -> np.ndarray:
        """Make the cache hold `tokens`; return float32 logits (n_logits, n_vocab) for the last positions.

        `skip` (one flag per those positions) leaves out rows nobody needs: the output layer is about a
        third of a batch's cost on a CPU. The rows kept come back in order.

        A `prompt` is decoded as a prefill from scratch would be, whatever the cache held: from a multiple of
        PREFILL_TILE, at least that many tokens. A batched kernel computes a row alike in any batch where the row
        falls in a whole tile, and the rows past the last whole tile alike where as many are left over; a
        one-token decode may differ at a near tie. So a prompt's logits are the same bits whether it was
        prefilled whole or partly reused (the live cache, a prompt cache's entry).

        The logits may be a view of llama.cpp's own buffer, valid until this model's next decode:
        copy them to keep them longer.
        """
        if len(tokens) > self.n_ctx:
            raise ContextFull(
                f"{len(tokens)} tokens do not fit the context of {self.n_ctx} ({len(tokens) - self.n_ctx} too many)"
            )
        keep, live = len(self.tokens), self.tokens
        if tokens[:keep] != self.tokens:  # not an extension of the cache (which a round's is): the common prefix
            keep = next((i for i, (a, b) in enumerate(zip(self.tokens, tokens, strict=False)) if a != b), len(tokens))
        if self.prompts is not None and len(tokens) - n_logits - keep >= MIN_RESTORED:  # a prefill, not a round
            live = list(live)  # as it was: the restore may replace it
            keep = self._restore(tokens, keep)
            if prompt:
                self.cache_miss = self.prompts.missed(tokens, keep, live, self._text)
        elif prompt:
            self.cache_miss = None
        keep = min(keep, len(tokens) - n_logits)
        if prompt:
            keep = max(0, min(keep, len(tokens) - PREFILL_TILE)) // PREFILL_TILE * PREFILL_TILE
        self.trim(keep)  # also drops anything an interrupt left untracked
        return self._decode(tokens[len(self.tokens) :], n_logits, skip)

    def _restore(self, tokens: list[int], keep: int) -> int:
        """The prompt cache's entry sharing the most of `tokens`, restored where it shares MIN_RESTORED more than
        the `keep` tokens the live cache does: how many tokens the cache now shares."""
        assert self.prompts is not None
        shared, entry = self.prompts.best(tokens)
        if entry is None or shared < keep + MIN_RESTORED:
            return keep
        self.remember(hold=False)  # the live state, before it is replaced (an earlier conversation's)
        data = self.prompts.load(entry)
        if data is None:
            return keep
        llama_cpp.llama_memory_seq_rm(self._mem, 0, 0, -1)
        self.tokens = []
        ubytes = ctypes.c_ubyte * len(data)
        buffer = ubytes.from_buffer_copy(data) if isinstance(data, bytes) else ubytes.from_buffer(data)
        if llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(data), 0) != len(data):
            llama_cpp.llama_memory_seq_rm(self._mem, 0, 0, -1)  # a state llama.cpp refused: prefilled instead
            return 0
        self.tokens = [int(t) for t in entry.tokens]
        self._kept = len(self.tokens)
        return shared

    def remember(self, *, hold: bool = True) -> None:
        """Keep the cache's state in the prompt cache (where it holds MIN_KEPT tokens it does not have yet), held
        for the cache key the generations are under unless `hold` is False."""
        if self.prompts is None or len(self.tokens) < MIN_KEPT or self._kept == len(self.tokens):
            return
        self.trim(len(self.tokens))  # anything past the tracked tokens (an interrupted decode's) is not kept
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        data = bytearray(size)  # llama.cpp writes the state into it: no copy made
        if llama_cpp.llama_state_seq_get_data(self._ctx, (ctypes.c_ubyte * size).from_buffer(data), size, 0) == size:
            self.prompts.put(self.tokens, data, hold=hold)
            self._kept = len(self.tokens)

    def _logits(self, rows: int) -> np.ndarray:
        """The last decode's logits: a (rows, n_vocab) view of llama.cpp's buffer (made once per buffer and size:
        llama.cpp keeps the buffer until a decode needs more outputs than it holds)."""
        address = _logits_address(self._ctx) or 0
        view = self._views.get((address, rows))
        if view is None:
            if len(self._views) > 64:
                self._views.clear()
            buffer = (ctypes.c_float * (rows * self.n_vocab)).from_address(address)
            view = np.frombuffer(memoryview(buffer), dtype=np.float32).reshape(rows, self.n_vocab)
            self._views[(address, rows)] = view
        return view

    def _decode(self, new: list[int], n_logits: int, skip: Sequence[bool] = ()) -> np.ndarray:
        rows = []
        first_logit = len(new) - n_logits
        for start in range(0, len(new), self.n_batch):
            chunk = new[start : start + self.n_batch]
            b, pos0 = self._batch, len(self.tokens)
            n_out = 0
            for i, tok in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = tok, pos0 + i, 1, 0
                j = start + i - first_logit
                b.logits[i] = j >= 0 and not (j < len(skip) and skip[j])
                n_out += b.logits[i]
            b.n_tokens = len(chunk)
            t0, self._untracked = time.perf_counter(), True  # until its tokens are tracked
            rc = llama_cpp.llama_decode(self._ctx, b)
            meter.decoded(len(chunk), time.perf_counter() - t0)  # to the round timing this decode, if any
            if rc != 0:
                llama_cpp.llama_memory_seq_rm(self._mem, 0, len(self.tokens), -1)
                raise LocalspecError(f"{self.name}: llama_decode failed with code {rc}")
            self.tokens.extend(chunk)
            self._untracked = False
            self.n_decoded += len(chunk)
            if n_out:
                out = self._logits(n_out)
                more = start + self.n_batch < len(new)  # the next chunk's decode overwrites llama.cpp's buffer
                rows.append(out.copy() if more else out)
        if len(rows) > 1:
            return np.concatenate(rows)
        return rows[0] if rows else np.empty((0, self.n_vocab), np.float32)


QUANTS = {"Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "F16": "LLAMA_FTYPE_MOSTLY_F16", "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K"}


def requantize(src: Path, dst: Path, quant: str, threads: int | None = None) -> Path:
    """Write `src` requantized to `quant` (a key of QUANTS) at `dst`, unless it is there (about 20 s on 2 cores).

    A memory-bound target (Q8_0, F16 on a CPU) is where a draft model wins; this makes one without a download."""
    if quant not in QUANTS:
        raise LocalspecError(f"cannot requantize to {quant!r} (known: {', '.join(QUANTS)})")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = getattr(llama_cpp, QUANTS[quant]), True, threads or 0
    with locked(dst, timeout=600):  # a second process waits for the first's file rather than writing its own
        if dst.exists():
            return dst
        with atomic_path(dst) as part:  # moved into place when whole
            if llama_cpp.llama_model_quantize(str(src).encode(), str(part).encode(), ctypes.byref(params)) != 0:
                raise LocalspecError(f"{src}: llama.cpp could not requantize it to {quant}")
    return dst
