"""The prompt cache's tiers without a model: matching by prefix, budgets, files shared, damaged or unwritable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec.llama.prompts import PromptCache, clear, folder_usage

KEY = {"file": "target.gguf", "bytes": 1, "n_ctx": 4096}


def _cache(root: Path | None, *, ram: int = 10_000, disk: int = 10_000, key: dict = KEY) -> tuple[PromptCache, list]:
    notes: list[str] = []
    return PromptCache(key, ram=ram, disk=disk, root=root, warn=notes.append), notes


def _put(cache: PromptCache, tokens: list[int], data: bytes) -> None:
    cache.put(tokens, data)
    cache.flush()


def _get(cache: PromptCache, tokens: list[int]) -> tuple[int, bytes | None]:
    """(tokens shared, the state) of the entry sharing most of `tokens`."""
    shared, entry = cache.best(tokens)
    assert entry is not None
    return shared, cache.load(entry)


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


@pytest.mark.parametrize("damage", ["flip", "cut", "garbage", "empty"])
def test_a_damaged_entry_is_removed_and_never_trusted(tmp_path: Path, damage: str) -> None:
    first, _ = _cache(tmp_path)
    _put(first, [1, 2, 3], b"state-bytes")
    path = next(tmp_path.glob("*/*.kv"))
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-3] ^= 0xFF
    elif damage == "cut":
        raw = raw[:-4]
    elif damage == "garbage":
        raw = bytearray(b"not an entry at all")
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    second, notes = _cache(tmp_path, ram=0)
    _, entry = second.best([1, 2, 3])
    assert entry is None or second.load(entry) is None
    assert not path.exists()
    assert len(notes) == 1 and "removed" in notes[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_folder_is_one_line_and_memory_goes_on(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        cache, notes = _cache(tmp_path / "sub")
        _put(cache, [1, 2], b"x")
        _put(cache, [3, 4], b"y")
        assert _get(cache, [3, 4]) == (2, b"y")
        assert len(notes) == 1 and "memory only" in notes[0]
    finally:
        tmp_path.chmod(0o700)


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
