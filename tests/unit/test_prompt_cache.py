"""The prompt cache's tiers without a model: matching by prefix, budgets, files shared, damaged or unwritable."""

from __future__ import annotations

import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from localspec.llama.prompts import (
    MAGIC,
    CacheMemory,
    Entry,
    PromptCache,
    clear,
    folder_usage,
    key_folder,
    shared_memory,
)

KEY = {"file": "target.gguf", "bytes": 1, "n_ctx": 4096}


def _cache(
    root: Path | None, *, ram: int | CacheMemory = 10_000, disk: int = 10_000, key: dict = KEY
) -> tuple[PromptCache, list]:
    notes: list[str] = []
    return PromptCache(key, ram=ram, disk=disk, root=root, warn=notes.append), notes


def _put(cache: PromptCache, tokens: list[int], data: bytes) -> None:
    cache.put(tokens, data)
    cache.flush()


def _get(cache: PromptCache, tokens: list[int]) -> tuple[int, bytes | None]:
    """(tokens shared, the state) of the entry sharing most of `tokens`."""
    shared, entry = cache.best(tokens)
    assert entry is not None
    data = cache.load(entry)
    return shared, None if data is None else bytes(data)


def test_the_longest_shared_prefix_wins_and_an_extension_replaces_its_prefix() -> None:
    cache, _ = _cache(None)
    _put(cache, [1, 2, 3], b"abc")
    _put(cache, [1, 2, 9, 9], b"other")
    assert _get(cache, [1, 2, 3, 4, 5]) == (3, b"abc")
    _put(cache, [1, 2, 3, 4], b"abcd")  # the same conversation, longer: it holds the shorter state too
    assert len(cache.memory) == 2
    assert _get(cache, [1, 2, 3, 4, 5]) == (4, b"abcd")
    assert cache.best([7, 7]) == (0, None)


def test_memory_keeps_its_budget_least_recently_used_out_first() -> None:
    cache, _ = _cache(None, ram=10)
    _put(cache, [1], b"aaaa")
    _put(cache, [2], b"bbbb")
    _get(cache, [1])  # [1] used last
    _put(cache, [3], b"cccc")
    assert sorted(int(e.tokens[0]) for e in cache.memory.values()) == [1, 3]
    _put(cache, [4], b"x" * 11)  # over the whole budget: not kept
    assert cache.best([4])[0] == 0


def test_disk_entries_survive_a_restart_and_are_shared(tmp_path: Path) -> None:
    first, _ = _cache(tmp_path)
    _put(first, [5, 6, 7], b"state")
    second, _ = _cache(tmp_path, ram=0)  # a new process: only the disk
    assert _get(second, [5, 6, 7, 8]) == (3, b"state")
    _put(second, [8, 8], b"news")  # written by the other process, seen by the first as it appears
    assert _get(first, [8, 8]) == (2, b"news")
    other_model, _ = _cache(tmp_path, key={**KEY, "bytes": 2})
    assert other_model.best([5, 6, 7]) == (0, None)  # another model's states are never offered


def test_disk_keeps_its_budget_across_keys(tmp_path: Path) -> None:
    a, _ = _cache(tmp_path, disk=1000)
    b, _ = _cache(tmp_path, disk=1000, key={**KEY, "n_ctx": 8192})
    _put(a, [1], b"a" * 300)
    old = next(tmp_path.glob("*/*.kv"))
    os.utime(old, (1, 1))  # the least recently used
    _put(b, [2], b"b" * 300)
    _put(a, [3], b"c" * 300)
    assert not old.exists()
    files, size = folder_usage(tmp_path)
    assert files == 2 and size <= 1000
    assert clear(tmp_path) == size and folder_usage(tmp_path) == (0, 0)


def _entry_file(tmp_path: Path, tokens: list[int], data: bytes, key: dict = KEY) -> Path:
    cache, _ = _cache(tmp_path, key=key)
    _put(cache, tokens, data)
    return next(p for p in tmp_path.glob("*/*.kv") if p.parent == key_folder(tmp_path, key))


def _header_end(raw: bytes) -> int:
    (length,) = struct.unpack("<I", raw[len(MAGIC) : len(MAGIC) + 4])
    return len(MAGIC) + 4 + length


def _damaged(raw: bytes, damage: str) -> bytes:
    """The file's bytes, damaged as named: a flipped bit in each region, cut short, or crafted headers."""
    end = _header_end(raw)
    header = raw[len(MAGIC) + 4 : end]

    def with_header(text: bytes) -> bytes:
        return MAGIC + struct.pack("<I", len(text)) + text + raw[end:]

    flip = {"header": len(MAGIC) + 6, "tokens": end + 9, "state": end + 16 + 3, "checksum": len(raw) - 2}
    if damage in flip:
        out = bytearray(raw)
        out[flip[damage]] ^= 0x01
        return bytes(out)
    return {
        "cut": raw[:-4],
        "garbage": b"not an entry at all",
        "empty": b"",
        "a vast header length": MAGIC + struct.pack("<I", 2**31) + raw[len(MAGIC) + 4 :],
        "a deeply nested header": with_header(b"[" * 100_000 + b"]" * 100_000),
        "a vast token count": with_header(header.replace(b'"tokens": 4', b'"tokens": 99999999999')),
        "a negative state size": with_header(header.replace(b'"bytes": 11', b'"bytes": -11')),
        "a float state size": with_header(header.replace(b'"bytes": 11', b'"bytes": 1e400')),
        "a header that is a list": with_header(b"[1, 2]"),
    }[damage]


DAMAGES = ["header", "tokens", "state", "checksum", "cut", "garbage", "empty", "a vast header length"]
DAMAGES += ["a deeply nested header", "a vast token count", "a negative state size", "a float state size"]
DAMAGES += ["a header that is a list"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_or_crafted_entry_is_never_trusted(tmp_path: Path, damage: str) -> None:
    """Every region of the file is checked (a bit flipped in its header, tokens, state or checksum) and every header
    field bounded: the entry is never restored (a damaged one removed, one line said), and nothing raises."""
    path = _entry_file(tmp_path, [1, 2, 3, 4], b"state-bytes")
    damaged = _damaged(path.read_bytes(), damage)
    assert damaged != path.read_bytes()
    path.write_bytes(damaged)
    second, notes = _cache(tmp_path, ram=0)
    _, entry = second.best([1, 2, 3, 4, 5])
    assert entry is None or second.load(entry) is None
    assert not path.exists() or entry is None  # removed where it was read; a foreign-looking one is only skipped
    assert len(notes) <= 1 and all("removed" in n for n in notes)


def test_an_entry_of_another_key_in_this_folder_is_never_offered(tmp_path: Path) -> None:
    other_key = {**KEY, "n_ctx": 8192}
    foreign = _entry_file(tmp_path, [1, 2, 3], b"another model's state", key=other_key)
    folder = key_folder(tmp_path, KEY)
    folder.mkdir(parents=True, exist_ok=True)
    foreign.rename(folder / foreign.name)  # whole and checksummed, under this key's folder
    cache, _ = _cache(tmp_path, ram=0)
    assert cache.best([1, 2, 3, 4]) == (0, None)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_as_an_entry_never_blocks(tmp_path: Path) -> None:
    _entry_file(tmp_path, [1, 2, 3], b"state")
    os.mkfifo(key_folder(tmp_path, KEY) / ("0" * 24 + ".kv"))
    cache, _ = _cache(tmp_path, ram=0)
    assert _get(cache, [1, 2, 3, 4]) == (3, b"state")


def test_a_folder_that_cannot_be_made_is_one_line_and_memory_goes_on() -> None:
    cache, notes = _cache(Path(os.devnull) / "cache")  # for root too: nothing is made under a device
    _put(cache, [1, 2], b"x")
    _put(cache, [3, 4], b"y")
    assert _get(cache, [3, 4]) == (2, b"y")
    assert len(notes) == 1 and "memory only" in notes[0]


def test_a_failed_write_is_one_line_and_memory_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache's folder would be")
    cache, notes = _cache(blocker)  # its folder cannot be made: what a full or read-only disk gives too
    _put(cache, [1, 2], b"x")
    _put(cache, [3, 4], b"y")
    assert _get(cache, [1, 2]) == (2, b"x")
    assert len(notes) == 1 and "memory only" in notes[0]


def _text(tokens: object) -> str:
    return " ".join(str(int(t)) for t in tokens)  # type: ignore[attr-defined]


def test_a_live_cache_key_holds_its_entry_against_other_traffic() -> None:
    cache, _ = _cache(None, ram=10)
    cache.use("codex-1")
    _put(cache, [1, 1], b"aaaa")
    cache.use(None)  # other conversations, no key
    for t in (2, 3, 4):
        _put(cache, [t, t], b"bbbb")
    assert _get(cache, [1, 1, 5]) == (2, b"aaaa")  # least recently used of all, and kept
    assert cache.missed([2, 2, 9], 0, [], _text) == "an entry sharing 2 tokens was evicted by the cache's budget " + (
        "(--cache-ram, --cache-disk)"
    )
    cache.use("codex-1")
    _put(cache, [1, 1, 5, 6], b"aaaa")  # the conversation goes on: its newer state is held in its place
    cache.use(None)
    _put(cache, [7, 7], b"cccc")
    _put(cache, [8, 8], b"dddd")
    assert _get(cache, [1, 1, 5, 6, 9]) == (4, b"aaaa")


def test_a_key_unused_past_its_hold_is_evicted_like_any_entry() -> None:
    cache, _ = _cache(None, ram=10)
    cache.use("codex-1", seconds=1e-9)  # over by the next call
    _put(cache, [1, 1], b"aaaa")
    cache.use(None)
    _put(cache, [2, 2], b"bbbb")
    _put(cache, [3, 3], b"cccc")
    assert cache.best([1, 1])[0] == 0 and not cache.holds


def test_held_entries_that_fill_the_budget_give_way_oldest_first() -> None:
    cache, _ = _cache(None, ram=10)
    for key, t in (("a", 1), ("b", 2), ("c", 3)):
        cache.use(key)
        _put(cache, [t, t], b"xxxx")
    assert sorted(int(e.tokens[0]) for e in cache.memory.values()) == [2, 3]
    cache.use("a")
    assert cache.missed([1, 1, 4], 0, [], _text) == (
        "its key's entry (2 tokens) was evicted: the budget is all held by other live keys"
    )


def test_the_disk_tier_keeps_held_files_past_older_ones(tmp_path: Path) -> None:
    cache, _ = _cache(tmp_path, ram=0, disk=1000)
    cache.use("session")
    _put(cache, [1], b"a" * 300)
    held = next(tmp_path.glob("*/*.kv"))
    os.utime(held, (1, 1))  # the least recently used file
    cache.use(None)
    for t in (2, 3, 4):
        _put(cache, [t], b"b" * 300)
    assert held.exists() and folder_usage(tmp_path)[1] <= 1000


def test_a_miss_says_where_the_prompt_parts_from_what_was_cached() -> None:
    cache, _ = _cache(None)
    assert cache.missed([1, 2, 3], 0, [], _text) == "no entry shares its start"
    _put(cache, [1, 2, 3, 4, 5, 6], b"state")
    why = cache.missed([1, 2, 3, 9, 9], 3, [], _text)
    assert why == "it parts from the nearest entry at token 3: '1 2 3 9 9' where the cache had '1 2 3 4 5 6'"
    assert cache.missed([1, 2, 3, 4, 5, 6, 7, 8], 6, [], _text) is None  # it extends all of it: a hit
    assert "at token 2" in str(cache.missed([1, 2, 8], 2, [1, 2, 7, 7], _text))  # the model's live cache too
    cache.use("claude")
    _put(cache, [1, 2, 3, 4, 5, 6], b"state")
    assert cache.missed([1, 7, 3, 4, 5, 6, 7], 1, [], _text) == (
        "it parts from its key's last entry at token 1: '1 7 3 4 5 6 7' where the cache had '1 2 3 4 5 6'"
    )


def test_one_budget_holds_both_models_caches_and_the_writes_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target's and the draft model's caches share the process's budget, least recently used out first across
    both; states queued for a disk slower than the answers count in it, the oldest dropped first (only the one
    being written may go past it)."""
    memory = shared_memory(1000)
    assert shared_memory(1000) is memory
    target, _ = _cache(tmp_path, ram=memory, disk=10**6)
    draft, _ = _cache(tmp_path, ram=memory, disk=10**6, key={**KEY, "file": "draft.gguf"})
    writing, written = threading.Event(), threading.Event()
    real = PromptCache.write_file

    def slow(cache: PromptCache, entry: Entry) -> None:
        writing.set()
        written.wait(30)  # a disk that takes its time
        real(cache, entry)

    monkeypatch.setattr(PromptCache, "write_file", slow)
    target.put([1], b"a" * 300)
    assert writing.wait(30)
    for t in range(2, 30):
        (target if t % 2 else draft).put([t], bytes([t]) * 300)
        assert memory.held() <= memory.budget + 300, memory.held()  # the one being written past it, no more
    assert sorted(int(e.tokens[0]) for c in (target, draft) for e in c.memory.values()) == [1, 28, 29]
    assert {int(e.tokens[0]) for _, e in memory.queue} <= {28, 29}  # the oldest queued were dropped
    written.set()
    memory.flush()
    assert folder_usage(tmp_path)[0] <= 3  # the one written first, and the newest


def test_the_disk_tier_leaves_free_space_and_makes_room_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a small disk: the least recently used files go before a write, so the disk keeps its margin (a twentieth
    of the disk here); where even an empty tier would leave less, nothing is written and one line says so."""
    cache, notes = _cache(tmp_path, ram=0, disk=10**6)
    disk = {"total": 20_000, "free": 1_700}  # a margin of 1,000 bytes: 700 left for entries

    def usage(path: object) -> shutil._ntuple_diskusage:
        used = folder_usage(tmp_path)[1]
        return shutil._ntuple_diskusage(disk["total"], disk["total"] - disk["free"] + used, disk["free"] - used)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    for t in range(1, 5):
        _put(cache, [t], bytes([t]) * 150)  # about 300 bytes a file
        assert disk["free"] - folder_usage(tmp_path)[1] >= 1_000
    assert folder_usage(tmp_path)[0] == 2 and not notes  # the two newest fit
    _put(cache, [9], b"x" * 900)  # more than the disk can take with its margin
    assert len(notes) == 1 and "free" in notes[0] and "memory only" in notes[0]
    assert disk["free"] - folder_usage(tmp_path)[1] >= 1_000


def test_a_build_with_other_kernels_keys_its_states_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-cpp-python's version alone would let a stock build and a -DGGML_LLAMAFILE=OFF one share entries."""
    from localspec.llama import model

    stock = model.build_id.__wrapped__()
    info = model.build().system_info
    other = model.Build(model.build().version, info.replace("LLAMAFILE = 1 | ", ""), False)
    monkeypatch.setattr(model, "build", lambda: other if "LLAMAFILE" in info else model.Build("", info + "X", False))
    assert model.build_id.__wrapped__() != stock


def test_a_write_removes_what_a_process_left_half_written(tmp_path: Path) -> None:
    folder = tmp_path / "0123456789abcdef"
    folder.mkdir()
    old, new = folder / ".x.kv.abc.tmp", folder / ".y.kv.def.tmp"
    for tmp in (old, new):
        tmp.write_bytes(b"half")
    os.utime(old, (1, 1))
    cache, _ = _cache(tmp_path)
    _put(cache, [1, 2], b"state")
    assert not old.exists() and new.exists()  # a write in progress elsewhere is left alone
