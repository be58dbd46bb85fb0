"""A cache of KV states by token prefix, in memory and on disk: a prompt seen before is restored, not prefilled.

An entry is the state of one model's sequence after some tokens (llama.cpp's sequence-state bytes) with those
tokens. A new prompt takes the entry sharing its longest prefix; the model keeps that prefix and decodes the rest.

Two tiers, each with a byte budget, least recently used out first: memory (a dict of bytes), and disk (one file
an entry under the cache directory, in a folder per `key`: the model file's identity and every setting that
changes what its cache holds). A file is written whole under a temporary name and moved into place, checked by
its length and CRC-32 when read, and its header repeats the key: a damaged, partial or foreign file is removed
and its prompt prefilled, never trusted. Several processes may share the folder: each sees the others' entries
as they appear. A failure to read or write the disk (full, read-only) is one line on `warn`, once, and the
answer is the same.

A cache key (a client's name for a conversation: OpenAI's `prompt_cache_key`, an Anthropic session marking
`cache_control`) holds the newest entry its generations used or made: other traffic does not evict it while the key
was used in the last `seconds` it asked for (only where held entries alone fill a budget does the oldest go). And
where a prompt reuses less than the cache could have given, `missed` says why: its key's entry evicted, or the
prompt parting from the nearest entry (the text where they part: a template, the tools or instructions changed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.files import STALE_SECONDS, atomic_path

MAGIC = b"localspec-kv\x01\n"
SUFFIX = ".kv"
MiB = 2**20
HOLD_SECONDS = 600.0  # how long an unused cache key holds its entry (OpenAI keeps a prefix 5-10 minutes)
GONE = 32  # entries the budgets removed, remembered (by their tokens) to say why a later prompt missed
_WRITERS: set[threading.Thread] = set()  # every cache's writes in progress (flush_all)


@dataclass
class Entry:
    """A cached state: its tokens, its size, and where its bytes are (memory, a file, or both)."""

    tokens: np.ndarray  # int32
    size: int
    data: bytes | None = None
    path: Path | None = None


@dataclass
class Hold:
    """A cache key's newest entry (by name, with its tokens), kept from eviction until `until` (time.monotonic)."""

    name: bytes
    tokens: np.ndarray
    until: float


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def key_folder(root: Path, key: dict[str, Any]) -> Path:
    """The folder under `root` of the entries made under `key`."""
    text = json.dumps(key, sort_keys=True)
    return root / hashlib.sha256(text.encode()).hexdigest()[:16]


class PromptCache:
    """KV states by token prefix (see the module docstring). `ram` and `disk` are byte budgets (0: no such
    tier); `root` holds the disk tier's folders, one per key; `warn` takes a one-line note."""

    def __init__(
        self,
        key: dict[str, Any],
        *,
        ram: int,
        disk: int = 0,
        root: Path | None = None,
        warn: Callable[[str], None] = print,
    ) -> None:
        self.key, self.ram, self.disk, self.root, self.warn = key, ram, disk if root else 0, root, warn
        self.folder = key_folder(root, key) if root else None
        self.memory: dict[bytes, Entry] = {}  # by the tokens' hash, least recently used first
        self.files: dict[Path, Entry] = {}  # the disk tier's entries, as last listed
        self._listed: int | None = None  # the folder's mtime when it was listed
        self._warned: set[str] = set()
        self._writing = threading.Lock()
        self._writers: list[threading.Thread] = []
        self.holds: dict[str, Hold] = {}  # by cache key
        self.holder: tuple[str, float] | None = None  # the key the generations now are under, and for how long
        self.gone: deque[np.ndarray] = deque(maxlen=GONE)  # the tokens of entries the budgets removed

    # ---- cache keys -------------------------------------------------------------------------------
    def use(self, key: str | None, seconds: float = HOLD_SECONDS) -> None:
        """The generations to come are under `key` (None: none): the newest entry they use or make is held
        from eviction until the key goes unused for `seconds`."""
        now = time.monotonic()
        for name in [k for k, hold in self.holds.items() if hold.until < now]:
            del self.holds[name]
        self.holder = None if key is None else (key, seconds)
        if key is not None and key in self.holds:
            self.holds[key].until = max(self.holds[key].until, now + seconds)

    def _hold(self, entry: Entry) -> None:
        """`entry` is the newest of the key the generations are under."""
        if self.holder is not None:
            key, seconds = self.holder
            until = max(time.monotonic() + seconds, self.holds[key].until if key in self.holds else 0.0)
            self.holds[key] = Hold(_name(entry.tokens), entry.tokens, until)

    def _held(self) -> set[bytes]:
        """The names of the entries live keys hold."""
        now = time.monotonic()
        return {hold.name for hold in list(self.holds.values()) if hold.until >= now}

    def missed(
        self, tokens: Sequence[int], reused: int, live: Sequence[int], text: Callable[[np.ndarray], str]
    ) -> str | None:
        """Why a prompt reused only `reused` of its tokens where its key's entry, the cache or the `live` tokens
        (the model's cache before it) could have given more (None: nothing shared more, or the prompt extends all
        of what it reused). `text` writes tokens as text, to show where the prompt parts from what was cached."""
        want = np.asarray(tokens, np.int32)
        hold = self.holds.get(self.holder[0]) if self.holder is not None else None
        if hold is not None:
            n = common_prefix(hold.tokens, want)
            if n == len(hold.tokens) and n > reused:
                return f"its key's entry ({n} tokens) was evicted: the budget is all held by other live keys"
            if n < len(hold.tokens) and n < len(want):
                return f"it parts from its key's last entry at token {n}: {_parting(want, hold.tokens, n, text)}"
        shared, entry = self.best(tokens)
        nearest = entry.tokens if entry is not None else np.empty(0, np.int32)
        if (n := common_prefix(np.asarray(live, np.int32), want)) > shared:
            shared, nearest = n, np.asarray(live, np.int32)
        if (gone := max((common_prefix(g, want) for g in self.gone), default=0)) > max(shared, reused):
            return f"an entry sharing {gone} tokens was evicted by the cache's budget (--cache-ram, --cache-disk)"
        if not shared:
            return "no entry shares its start"
        if shared < len(nearest) and shared < len(want):
            return f"it parts from the nearest entry at token {shared}: {_parting(want, nearest, shared, text)}"
        return None

    # ---- finding ----------------------------------------------------------------------------------
    def best(self, tokens: Sequence[int]) -> tuple[int, Entry | None]:
        """(shared tokens, entry) of the entry sharing the longest prefix with `tokens` ((0, None): none)."""
        want = np.asarray(tokens, np.int32)
        found: tuple[int, Entry | None] = (0, None)
        for entry in [*self.memory.values(), *self._disk_entries()]:
            n = common_prefix(entry.tokens, want)
            if n > found[0] or (n == found[0] and entry.data is not None and found[1] is not None):
                found = (n, entry)
        return found

    def load(self, entry: Entry) -> bytes | None:
        """The entry's state bytes (read and checked where only on disk; None, the file removed, where damaged)."""
        if entry.data is not None:
            self.memory[_name(entry.tokens)] = self.memory.pop(_name(entry.tokens), entry)  # most recently used
            self._hold(entry)
            return entry.data
        assert entry.path is not None
        data = self._read(entry.path)
        if data is None or len(data) != entry.size:
            self.files.pop(entry.path, None)
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # the disk tier's recency is the files' mtime
        self._remember(Entry(entry.tokens, entry.size, data, entry.path))
        self._hold(entry)
        return data

    # ---- keeping ----------------------------------------------------------------------------------
    def put(self, tokens: Sequence[int], data: bytes, *, hold: bool = True) -> None:
        """Keep the state after `tokens`, in memory and (written in the background) on disk; held for the key the
        generations are under unless `hold` is False (a state left from before it)."""
        entry = Entry(np.asarray(tokens, np.int32), len(data), data)
        if hold:
            self._hold(entry)
        self._remember(entry)
        if self.folder is not None and self.disk and "write" not in self._warned and entry.size <= self.disk:
            writer = threading.Thread(target=self._write, args=(entry,), name="localspec-prompt-cache")
            self._writers = [w for w in self._writers if w.is_alive()] + [writer]
            _WRITERS.difference_update([w for w in _WRITERS if not w.is_alive()])
            _WRITERS.add(writer)
            writer.start()  # not a daemon: a process ending waits for its entry to be whole on disk

    def flush(self) -> None:
        """Wait for the entries being written."""
        for writer in self._writers:
            writer.join()
        self._writers = []

    def _remember(self, entry: Entry) -> None:
        """Into the memory tier: entries this one extends go (it holds their states too, and their keys' holds),
        then the least recently used not held while over the budget (the least recently used held one where
        held ones fill it)."""
        if not self.ram or entry.size > self.ram:
            return
        name = _name(entry.tokens)
        for other_name, other in list(self.memory.items()):
            if _extends(entry.tokens, other.tokens):
                del self.memory[other_name]
                for hold in self.holds.values():
                    if hold.name == other_name:
                        hold.name, hold.tokens = name, entry.tokens
        self.memory[name] = entry
        held = self._held()
        while sum(e.size for e in self.memory.values()) > self.ram:
            out = next((n for n in self.memory if n not in held), next(iter(self.memory)))
            gone = self.memory.pop(out)
            if self.folder is None or not self.disk:  # else its file keeps it
                self.gone.append(gone.tokens)

    # ---- the disk tier ----------------------------------------------------------------------------
    def _disk_entries(self) -> list[Entry]:
        """The disk tier's entries not in memory, the folder listed again when another process changed it."""
        if self.folder is None or not self.disk:
            return []
        try:
            mtime = self.folder.stat().st_mtime_ns
        except OSError:
            mtime = None
        if mtime != self._listed:
            self._listed, self.files = mtime, {p: e for p in self._paths() if (e := self._index(p)) is not None}
        entries = list(self.files.values())  # at once: a writer thread may remove files meanwhile
        return [e for e in entries if _name(e.tokens) not in self.memory]

    def _paths(self) -> list[Path]:
        try:
            return [p for p in self.folder.iterdir() if p.suffix == SUFFIX] if self.folder else []
        except OSError:
            return []

    def _index(self, path: Path) -> Entry | None:
        """A file's entry from its header and tokens (its state is read when it is used)."""
        try:
            with open(path, "rb") as f:
                header, tokens = _read_head(f)
        except (OSError, ValueError):
            self._drop(path, "a damaged entry")
            return None
        if header.get("key") != self.key:
            return None
        return Entry(tokens, int(header["bytes"]), path=path)

    def _read(self, path: Path) -> bytes | None:
        try:
            with open(path, "rb") as f:
                header, _ = _read_head(f)
                data = f.read()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            self._once("read", f"cannot read the prompt cache's {path} ({e}); its prompt is prefilled")
            return None
        if header.get("key") != self.key or len(data) != header.get("bytes") or zlib.crc32(data) != header.get("crc"):
            self._drop(path, "a damaged entry")
            return None
        return data

    def _write(self, entry: Entry) -> None:
        assert self.folder is not None and entry.data is not None
        path = self.folder / (_name(entry.tokens).hex() + SUFFIX)
        crc = zlib.crc32(entry.data)
        header = json.dumps({"key": self.key, "tokens": len(entry.tokens), "bytes": entry.size, "crc": crc}).encode()
        with self._writing:
            try:
                with atomic_path(path) as part, open(part, "wb") as f:
                    f.write(MAGIC + struct.pack("<I", len(header)) + header)
                    f.write(entry.tokens.astype("<i4").tobytes())
                    f.write(entry.data)
                entry.path = path
                self._trim_disk(entry)
            except OSError as e:
                self._once(
                    "write",
                    f"cannot write the prompt cache in {self.folder} ({e.strerror or e}); "
                    "prompts are kept in memory only",
                )

    def _trim_disk(self, new: Entry) -> None:
        """Files the new entry extends go; then, over the budget, the least recently used files of every key."""
        for path, other in list(self.files.items()):
            if path != new.path and _extends(new.tokens, other.tokens):
                self._drop(path)
        assert self.root is not None
        files = []
        for path in self.root.glob("*/*"):
            with contextlib.suppress(OSError):
                st = path.stat()
                if path.suffix == SUFFIX:
                    files.append((st.st_mtime, st.st_size, path))
                elif path.name.startswith(".") and st.st_mtime < time.time() - STALE_SECONDS:
                    path.unlink()  # a write a process never finished
        total = sum(size for _, size, _ in files)
        held = {self.folder / (name.hex() + SUFFIX) for name in self._held()} if self.folder else set()
        for _, size, path in sorted(files, key=lambda f: (f[2] in held, f[0])):  # held files last
            if total <= self.disk:
                break
            if path != new.path:
                if (gone := self.files.get(path)) is not None:
                    self.gone.append(gone.tokens)
                self._drop(path)
                total -= size

    def _drop(self, path: Path, why: str = "") -> None:
        self.files.pop(path, None)
        with contextlib.suppress(OSError):
            path.unlink()
        if why:
            self._once(why, f"the prompt cache's {path.name} was {why}: removed, its prompt prefilled")

    def _once(self, kind: str, text: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            self.warn(f"localspec: {text}")


def _extends(tokens: np.ndarray, other: np.ndarray) -> bool:
    """Whether `tokens` begin with all of `other`."""
    return len(other) <= len(tokens) and common_prefix(other, tokens) == len(other)


def _parting(want: np.ndarray, cached: np.ndarray, at: int, text: Callable[[np.ndarray], str]) -> str:
    """Where a prompt parts from a cached entry, as text: a few tokens of each from there."""
    start = max(at - 4, 0)
    return f"{_excerpt(text(want[start : at + 8]))} where the cache had {_excerpt(text(cached[start : at + 8]))}"


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:59] + "…")


def _name(tokens: np.ndarray) -> bytes:
    return hashlib.sha256(tokens.astype("<i4").tobytes()).digest()[:12]


def _read_head(f: Any) -> tuple[dict[str, Any], np.ndarray]:
    """(header, tokens) of an entry file open at its start; ValueError where it is not one."""
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a prompt cache entry")
    try:
        (length,) = struct.unpack("<I", f.read(4))
        header = json.loads(f.read(length))
        n, _, _ = int(header["tokens"]), int(header["bytes"]), int(header["crc"])
    except (struct.error, KeyError, TypeError) as e:
        raise ValueError(f"a damaged header ({e})") from None
    raw = f.read(4 * n)
    if len(raw) != 4 * n:
        raise ValueError("cut short")
    return header, np.frombuffer(raw, "<i4").astype(np.int32)


def flush_all() -> None:
    """Wait for every cache's writes in progress (before a process ends without running its threads out)."""
    for writer in list(_WRITERS):
        writer.join()
        _WRITERS.discard(writer)


def folder_usage(root: Path) -> tuple[int, int]:
    """(files, bytes) of the disk tier under `root`, every key's."""
    files = [p for p in root.glob(f"*/*{SUFFIX}") if p.is_file()] if root.is_dir() else []
    return len(files), sum(p.stat().st_size for p in files)


def clear(root: Path) -> int:
    """Remove every entry under `root`; the bytes freed."""
    freed = 0
    for path in root.glob(f"*/*{SUFFIX}") if root.is_dir() else []:
        with contextlib.suppress(OSError):
            freed += path.stat().st_size
            path.unlink()
    return freed
