"""A cache of KV states by token prefix, in memory and on disk: a prompt seen before is restored, not prefilled.

An entry is the state of one model's sequence after some tokens (llama.cpp's sequence-state bytes) with those
tokens. A new prompt takes the entry sharing its longest prefix; the model keeps that prefix and decodes the rest.

Two tiers, least recently used out first. Memory: one byte budget for the process (`CacheMemory`), shared by the
target's and the draft model's caches, and counting the states queued for the disk, which one thread writes in
order. Disk: one file an entry under the cache directory, in a folder per `key` (the model file's identity, the
llama.cpp build, every setting that changes what its cache holds), within its own budget and a margin of free
space left on the disk, made before each write. A file is written whole under a temporary name and moved into
place; when read, it is checked whole (its length, a CRC-32 over its header, tokens and state, the key in its
header) and every header field bounded: a damaged, partial, crafted or foreign file (or anything not a regular
file) is never trusted, a damaged one removed and its prompt prefilled. Several processes may share the folder:
each sees the others' entries as they appear. A failure to read or write the disk (full, read-only) is one line
on `warn`, once, and the answer is the same.

A cache key (a client's name for a conversation: OpenAI's `prompt_cache_key`, an Anthropic session marking
`cache_control`) holds the newest entry its generations used or made: other traffic does not evict it while the key
was used in the last `seconds` it asked for (only where held entries alone fill a budget does the oldest go). And
where a prompt reuses less than the cache could have given, `missed` says why: its key's entry evicted, or the
prompt parting from the nearest entry (the text where they part: a template, the tools or instructions changed).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import stat
import struct
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localspec.files import atomic_path, sweep

MAGIC = b"localspec-kv\x02\n"
SUFFIX = ".kv"
MiB = 2**20
GiB = 2**30
HOLD_SECONDS = 600.0  # how long an unused cache key holds its entry (OpenAI keeps a prefix 5-10 minutes)
GONE = 32  # entries the budgets removed, remembered (by their tokens) to say why a later prompt missed
MAX_HEADER = 2**16  # bytes of an entry's header
MAX_TOKENS = 2**24  # tokens of an entry (more than any context holds)
FREE_MARGIN = GiB  # free space the disk tier leaves on its disk (at most: a twentieth of a smaller disk)
Buffer = bytes | bytearray | memoryview
_uses = itertools.count()  # the order in which entries were last used, across every cache
_MEMORIES: weakref.WeakSet[CacheMemory] = weakref.WeakSet()  # every process budget (flush_all)
_SHARED: weakref.WeakValueDictionary[int, CacheMemory] = weakref.WeakValueDictionary()  # by budget (shared_memory)


@dataclass
class Entry:
    """A cached state: its tokens, its size, where its bytes are (memory, a file, or both), when it was last used."""

    tokens: np.ndarray  # int32
    size: int
    data: Buffer | None = None
    path: Path | None = None
    used: int = field(default_factory=lambda: next(_uses))


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


class CacheMemory:
    """A process's memory for cached states: every prompt cache's memory tier and the states queued for their disk
    tiers, within one byte `budget`, the least recently used out first (entries that live cache keys hold last: the
    oldest of them only where they alone fill it); a state dropped while queued is not written. One thread writes
    the queued states, in order (not a daemon: a process ending waits for the entry being written)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.caches: weakref.WeakSet[PromptCache] = weakref.WeakSet()
        self.queue: deque[tuple[PromptCache, Entry]] = deque()
        self.writing: Entry | None = None
        self.lock = threading.RLock()
        self.idle = threading.Condition(self.lock)
        self.writer: threading.Thread | None = None
        _MEMORIES.add(self)

    def held(self) -> int:
        """The bytes held: the memory tiers', and the queued (or being written) states no tier holds."""
        with self.lock:
            caches = list(self.caches)
            kept = {id(e) for c in caches for e in c.memory.values()}
            queued = [e for _, e in self.queue] + ([self.writing] if self.writing is not None else [])
            return sum(e.size for c in caches for e in c.memory.values()) + sum(
                e.size for e in {id(e): e for e in queued if id(e) not in kept}.values()
            )

    def shrink(self) -> None:
        """Out, least recently used first, until what is held fits the budget (the state being written stays)."""
        with self.lock:
            while self.held() > self.budget:
                victim = self._oldest()
                if victim is None:
                    return
                cache, entry = victim
                if cache.memory.get(_name(entry.tokens)) is entry:
                    cache.forget(entry)
                self.queue = deque((c, e) for c, e in self.queue if e is not entry)

    def _oldest(self) -> tuple[PromptCache, Entry] | None:
        """The least recently used state to let go (not the one being written or next to be): one no live key
        holds if there is one."""
        busy = self.writing or (self.queue[0][1] if self.queue else None)
        candidates = [(c, e) for c in list(self.caches) for e in c.memory.values()]
        candidates += [(c, e) for c, e in self.queue if c.memory.get(_name(e.tokens)) is not e]
        candidates = [(c, e) for c, e in candidates if e is not busy]
        held = {id(c): c.held_names() for c in {id(c): c for c, _ in candidates}.values()}
        free = [(c, e) for c, e in candidates if _name(e.tokens) not in held[id(c)]]
        return min(free or candidates, key=lambda ce: ce[1].used) if candidates else None

    def queue_write(self, cache: PromptCache, entry: Entry) -> None:
        """Queue `entry` for `cache`'s disk tier (the writer started where none runs)."""
        with self.lock:
            self.queue.append((cache, entry))
            self.shrink()
            if self.writer is None and self.queue:
                self.writer = threading.Thread(target=self._write_all, name="localspec-prompt-cache")
                self.writer.start()

    def _write_all(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.writer = None
                    self.idle.notify_all()
                    return
                cache, self.writing = self.queue.popleft()
            try:
                cache.write_file(self.writing)
            finally:
                with self.lock:
                    self.writing = None
                    self.shrink()

    def flush(self) -> None:
        """Wait for the queued states to be written."""
        with self.idle:
            self.idle.wait_for(lambda: not self.queue and self.writing is None)


def shared_memory(budget: int) -> CacheMemory:
    """The process's CacheMemory of `budget` bytes (one for every cache made with it while any is alive)."""
    memory = _SHARED.get(budget)
    if memory is None:
        memory = _SHARED[budget] = CacheMemory(budget)
    return memory


class PromptCache:
    """KV states by token prefix (see the module docstring). `ram` is the memory tier's budget: a CacheMemory
    shared with other caches, or a number of bytes of its own (0: no memory tier); `disk` the disk tier's budget
    (0: none) under `root`, a folder a key; `warn` takes a one-line note."""

    def __init__(
        self,
        key: dict[str, Any],
        *,
        ram: CacheMemory | int,
        disk: int = 0,
        root: Path | None = None,
        warn: Callable[[str], None] = print,
    ) -> None:
        self.key, self.disk, self.root, self.warn = key, disk if root else 0, root, warn
        self.shared = ram if isinstance(ram, CacheMemory) else CacheMemory(ram)
        self.shared.caches.add(self)
        self.folder = key_folder(root, key) if root else None
        self.memory: dict[bytes, Entry] = {}  # by the tokens' hash
        self.files: dict[Path, Entry] = {}  # the disk tier's entries, as last listed
        self._listed: int | None = None  # the folder's mtime when it was listed
        self._warned: set[str] = set()
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

    def held_names(self) -> set[bytes]:
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
        if (gone := max((common_prefix(g, want) for g in list(self.gone)), default=0)) > max(shared, reused):
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
        with self.shared.lock:  # the writer's thread may let entries go meanwhile
            kept = list(self.memory.values())
        for entry in [*kept, *self._disk_entries()]:
            n = common_prefix(entry.tokens, want)
            if n > found[0] or (n == found[0] and entry.data is not None and found[1] is not None):
                found = (n, entry)
        return found

    def load(self, entry: Entry) -> Buffer | None:
        """The entry's state bytes (read and checked where only on disk; None, the file removed, where damaged)."""
        entry.used = next(_uses)
        if entry.data is not None:
            self._hold(entry)
            return entry.data
        assert entry.path is not None
        data = self._read(entry.path)
        if data is None or len(data) != entry.size:
            self.files.pop(entry.path, None)
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # the disk tier's recency is the files' mtime
        kept = Entry(entry.tokens, entry.size, data, entry.path)
        self._hold(kept)
        self._remember(kept)
        return data

    # ---- keeping ----------------------------------------------------------------------------------
    def put(self, tokens: Sequence[int], data: Buffer, *, hold: bool = True) -> None:
        """Keep the state after `tokens`, in memory and (queued for the writer) on disk; held for the key the
        generations are under unless `hold` is False (a state left from before it)."""
        entry = Entry(np.asarray(tokens, np.int32), len(data), data)
        if hold:
            self._hold(entry)
        self._remember(entry)
        if self.folder is not None and self.disk and not self._warned & {"write", "space"} and entry.size <= self.disk:
            self.shared.queue_write(self, entry)

    def flush(self) -> None:
        """Wait for the entries queued to be written."""
        self.shared.flush()

    def _remember(self, entry: Entry) -> None:
        """Into the memory tier: entries this one extends go (it holds their states too, and their keys' holds);
        then the process's memory is held to its budget."""
        if entry.size > self.shared.budget:
            return
        name = _name(entry.tokens)
        with self.shared.lock:
            for other_name, other in list(self.memory.items()):
                if _extends(entry.tokens, other.tokens):
                    del self.memory[other_name]
                    for hold in self.holds.values():
                        if hold.name == other_name:
                            hold.name, hold.tokens = name, entry.tokens
            self.memory[name] = entry
            self.shared.shrink()

    def forget(self, entry: Entry) -> None:
        """Out of the memory tier (by the budget), remembered as gone where no disk tier keeps it."""
        self.memory.pop(_name(entry.tokens), None)
        if self.folder is None or not self.disk:
            self.gone.append(entry.tokens)

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
        entries = list(self.files.values())  # at once: the writer may remove files meanwhile
        return [e for e in entries if _name(e.tokens) not in self.memory]

    def _paths(self) -> list[Path]:
        try:
            return [p for p in self.folder.iterdir() if p.suffix == SUFFIX] if self.folder else []
        except OSError:
            return []

    def _index(self, path: Path) -> Entry | None:
        """A file's entry from its header and tokens (its state is read, and the whole file checked, when used)."""
        try:
            with _open(path) as f:
                header, tokens, _ = _read_head(f, os.fstat(f.fileno()).st_size)
        except OSError:
            return None
        except ValueError:
            self._drop(path, "a damaged entry")
            return None
        if header.get("key") != self.key:
            return None
        return Entry(tokens, int(header["bytes"]), path=path)

    def _read(self, path: Path) -> memoryview | None:
        """A file's state, its whole file checked (None where it is not a whole entry of this key's)."""
        try:
            with _open(path) as f:
                size = os.fstat(f.fileno()).st_size
                header, _, start = _read_head(f, size)
                whole = bytearray(size)
                f.seek(0)
                if f.readinto(whole) != size:
                    raise ValueError("cut short")
        except FileNotFoundError:
            return None
        except ValueError:
            self._drop(path, "a damaged entry")
            return None
        except OSError as e:
            self._once("read", f"cannot read the prompt cache's {path} ({e}); its prompt is prefilled")
            return None
        (crc,) = struct.unpack("<I", whole[-4:])
        if header.get("key") != self.key or zlib.crc32(memoryview(whole)[:-4]) != crc:
            self._drop(path, "a damaged entry")
            return None
        return memoryview(whole)[start:-4]

    def write_file(self, entry: Entry) -> None:
        """Write an entry's file (the writer's thread), room made first: the disk tier's budget and the disk's margin
        of free space."""
        assert self.folder is not None and entry.data is not None
        path = self.folder / (_name(entry.tokens).hex() + SUFFIX)
        header = json.dumps({"key": self.key, "tokens": len(entry.tokens), "bytes": entry.size}).encode()
        head = MAGIC + struct.pack("<I", len(header)) + header + entry.tokens.astype("<i4").tobytes()
        crc = zlib.crc32(entry.data, zlib.crc32(head))
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not self._room(len(head) + entry.size + 4, path):
                return
            with atomic_path(path) as part, open(part, "wb") as f:
                f.write(head)
                f.write(entry.data)
                f.write(struct.pack("<I", crc))
            entry.path = path
            for other_path, other in list(self.files.items()):  # what the new entry extends goes
                if other_path != path and _extends(entry.tokens, other.tokens):
                    self._drop(other_path)
        except OSError as e:
            self._once(
                "write",
                f"cannot write the prompt cache in {self.folder} ({e.strerror or e}); prompts are kept in memory only",
            )

    def _room(self, size: int, path: Path) -> bool:
        """Room for `size` bytes: the least recently used files of every key out (those live keys hold last) until
        the disk tier holds at most its budget with them and the disk keeps its margin free; False (said once)
        where even an empty tier leaves too little free."""
        assert self.root is not None and self.folder is not None
        held = {self.folder / (name.hex() + SUFFIX) for name in self.held_names()}
        files = []
        for folder in self._folders():
            sweep(folder)  # writes a process never finished
        for other in self.root.glob(f"*/*{SUFFIX}"):
            with contextlib.suppress(OSError):
                st = other.stat()
                if other != path:
                    files.append((other in held, st.st_mtime, st.st_size, other))
        disk = shutil.disk_usage(self.folder)
        margin = min(FREE_MARGIN, disk.total // 20)
        total, free = sum(f[2] for f in files), disk.free
        for _, _, other_size, other in sorted(files):
            if total + size <= self.disk and free - size >= margin:
                break
            if (gone := self.files.get(other)) is not None:
                self.gone.append(gone.tokens)
            self._drop(other)
            total, free = total - other_size, free + other_size
        if total + size > self.disk:
            return False
        if free - size < margin:
            self._once(
                "space",
                f"{free / MiB:.0f} MiB are free on the disk of {self.root}: the prompt cache leaves "
                f"{margin / MiB:.0f} MiB free, and keeps prompts in memory only",
            )
            return False
        return True

    def _folders(self) -> list[Path]:
        """Every key's folder under the root."""
        assert self.root is not None
        try:
            return [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            return []

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


def _open(path: Path) -> Any:
    """`path` open for reading, refused (ValueError) where it is not a regular file: a FIFO would block for ever."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file")
    return os.fdopen(fd, "rb")


def _read_head(f: Any, size: int) -> tuple[dict[str, Any], np.ndarray, int]:
    """(header, tokens, where the state starts) of an entry file of `size` bytes open at its start; ValueError
    where it is not one: every field bounded, and the file exactly as long as its header says."""
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a prompt cache entry")
    try:
        (length,) = struct.unpack("<I", f.read(4))
        if length > MAX_HEADER:
            raise ValueError(f"a header of {length} bytes")
        header = json.loads(f.read(length))
        n, data = header["tokens"], header["bytes"]
        if not (isinstance(n, int) and isinstance(data, int) and 0 < n <= MAX_TOKENS and data > 0):
            raise ValueError("header fields out of range")
    except (struct.error, KeyError, TypeError, RecursionError, UnicodeDecodeError) as e:
        raise ValueError(f"a damaged header ({e})") from None
    start = len(MAGIC) + 4 + length + 4 * n
    if size != start + data + 4:
        raise ValueError("not the length its header says")
    raw = f.read(4 * n)
    if len(raw) != 4 * n:
        raise ValueError("cut short")
    return header, np.frombuffer(raw, "<i4").astype(np.int32), start


def flush_all() -> None:
    """Wait for every cache's queued writes (before a process ends without running its threads out)."""
    for memory in list(_MEMORIES):
        memory.flush()


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
