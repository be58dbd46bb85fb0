"""Drafting from earlier answers without a model: the store's matches, bound and file, and the drafter following."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Verdict
from localspec.drafting.recall import MIN_MATCH, AnswerStore, Recall

PROMPT = list(range(100, 140))
ANSWER = list(range(500, 560))


def test_the_longest_match_wins_then_the_latest() -> None:
    store = AnswerStore()
    store.add(PROMPT[-32:], ANSWER)
    store.add([7, 7, *PROMPT[-3:]], [900, 901])  # a shorter match of the same last tokens, later
    at, matched = store.match([1, 2, *PROMPT])
    assert store.tokens[at] == ANSWER[0] and matched == 32
    store.add(PROMPT[-32:], [42, 43])  # as long, and later
    at, matched = store.match(PROMPT)
    assert store.tokens[at] == 42 and matched == 32
    assert store.match([3, 4, 5]) == (0, 0)


def test_the_store_keeps_its_bound_and_its_file(tmp_path: Path) -> None:
    path = tmp_path / "answers.npy"
    store = AnswerStore(path, limit=100)
    for i in range(10):
        store.add([i, i + 1], [1000 + i] * 20)
    assert len(store.tokens) <= 100
    assert store.tokens[-2] == 1009 and store.tokens[0] != 1000  # the oldest went first
    again = AnswerStore(path, limit=100)
    assert list(again.tokens) == list(store.tokens)


def _npy(tokens: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, tokens, allow_pickle=False)
    return buffer.getvalue()


GOOD = _npy(np.asarray([5, 6, 7, -1], np.int32))
DAMAGED = {
    "empty": b"",
    "garbage": b"not a numpy file",
    "cut short": GOOD[:-3],
    "a header claiming a vast shape": GOOD.replace(b"(4,)", b"(99999999999999,)"),
    "a header that is no header": GOOD.replace(b"'descr'", b"'dxscr'"),
    "a token beyond the vocabulary": _npy(np.asarray([5, 151_936, -1], np.int32)),
    "a negative token": _npy(np.asarray([5, -7, -1], np.int32)),
    "another dtype": _npy(np.asarray([5.0, 6.0], np.float64)),
    "two dimensions": _npy(np.zeros((2, 2), np.int32)),
}


@pytest.mark.parametrize("damage", list(DAMAGED), ids=list(DAMAGED))
def test_a_file_that_is_no_store_is_set_aside_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """Whatever the file holds, the store starts (afresh), and the file is set aside, not lost: one line says so."""
    path = tmp_path / "answers.npy"
    path.write_bytes(DAMAGED[damage])
    store = AnswerStore(path, vocab=151_936)
    assert len(store.tokens) == 0 and not path.exists()
    assert (tmp_path / "answers.npy.damaged").read_bytes() == DAMAGED[damage]
    assert capsys.readouterr().err.count("\n") == 1
    store.add([1, 2], [3, 4])
    assert list(AnswerStore(path, vocab=151_936).tokens) == [1, 2, 3, 4, -1]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_the_stores_place_never_blocks(tmp_path: Path) -> None:
    path = tmp_path / "answers.npy"
    os.mkfifo(path)
    assert len(AnswerStore(path).tokens) == 0 and not path.exists()


def test_processes_sharing_the_file_keep_each_others_answers_and_a_clear_holds(tmp_path: Path) -> None:
    path = tmp_path / "answers.npy"
    first, second = AnswerStore(path), AnswerStore(path)  # two processes' stores, started on the same file
    first.add([1], [10, 11])
    second.add([2], [20, 21])
    first.add([3], [30, 31])
    assert list(AnswerStore(path).tokens) == [1, 10, 11, -1, 2, 20, 21, -1, 3, 30, 31, -1]
    assert first.match([2, 20]) != (0, 0)  # the other process's answer drafts here too
    path.unlink()  # `localspec cache clear` while both run
    second.add([4], [40, 41])
    assert list(AnswerStore(path).tokens) == [4, 40, 41, -1]  # the cleared answers stay cleared


def test_temporary_files_a_process_left_are_removed(tmp_path: Path) -> None:
    old, new = tmp_path / ".answers.npy.abc.tmp", tmp_path / ".answers.npy.def.tmp"
    for tmp in (old, new):
        tmp.write_bytes(b"half")
    os.utime(old, (1, 1))
    AnswerStore(tmp_path / "answers.npy")
    assert not old.exists() and new.exists()  # a write in progress elsewhere is left alone


def test_recall_follows_an_earlier_answer_and_learns_where_it_breaks() -> None:
    store = AnswerStore()
    store.add(PROMPT[-32:], ANSWER)
    recall = Recall(store)
    ctx = [1, *PROMPT]
    recall.begin(len(ctx))
    offer = recall.offer(ctx, 8, 100, None)
    assert len(offer.survival) == 8 and offer.survival[0] > 0.5
    draft = recall.draft(ctx, 8, SamplerSettings(), InvariantSampling(0))
    assert draft == ANSWER[:8]
    ctx += ANSWER[:9]  # all accepted and the target's own token repeats the answer too
    recall.accept(ctx, Verdict(recall, 8, 8))
    assert recall.draft(ctx, 4, SamplerSettings(), InvariantSampling(0)) == ANSWER[9:13]
    ctx += [ANSWER[9], 77]  # one held, then the output wrote something else
    recall.accept(ctx, Verdict(recall, 4, 1))
    assert recall.at == 0
    assert not recall.offer(ctx, 8, 100, None).survival  # nothing matches here
    recall.end(ctx)
    assert store.match(ctx[-MIN_MATCH:])[1] == MIN_MATCH  # this answer is kept too


def test_a_draft_stops_at_its_answers_end() -> None:
    """Following an answer to its end never runs on into the next entry (the gap, another prompt's tokens)."""
    store = AnswerStore()
    store.add(PROMPT[-32:], ANSWER)
    store.add([7] * 32, [900, 901, 902])
    recall = Recall(store)
    ctx = [1, *PROMPT, *ANSWER[:-3]]
    recall.begin(len(PROMPT) + 1)
    assert recall.draft(ctx, 8, SamplerSettings(), InvariantSampling(0)) == ANSWER[-3:]
    assert len(recall.offer(ctx, 8, 100, None).survival) == 3


def test_a_short_match_is_not_followed() -> None:
    store = AnswerStore()
    store.add([1, 2, 3], ANSWER)
    recall = Recall(store)
    ctx = [9, 9, 9, 1, 2, 3]  # three tokens in common: a coincidence
    recall.begin(len(ctx))
    assert not recall.offer(ctx, 8, 100, None).survival


def test_the_index_taken_in_answer_by_answer_is_the_one_a_restart_builds(tmp_path: Path) -> None:
    """200 answers of random length over a small vocabulary (many equal pairs) into a store bounded at 5,000
    tokens: after each, its index (new pairs merged in, evicted ones out) holds exactly the pairs a fresh index of
    its tokens holds, each at its place, and a reloaded store matches as it does."""
    import numpy as np

    from localspec.drafting.recall import _pairs

    rng = np.random.default_rng(7)
    store = AnswerStore(tmp_path / "answers.npy", limit=5000)
    for _ in range(200):
        store.add(rng.integers(0, 50, 32).tolist(), rng.integers(0, 50, int(rng.integers(1, 300))).tolist())
        fresh = AnswerStore(tmp_path / "answers.npy", limit=5000)
        assert np.array_equal(store.tokens, fresh.tokens) and np.array_equal(store._pairs, fresh._pairs)
        assert np.array_equal(_pairs(store.tokens)[store._order], store._pairs)
        assert np.array_equal(np.sort(store._order), np.arange(len(store.tokens) - 1))
        ctx = rng.integers(0, 50, 40).tolist()
        assert store.match(ctx) == fresh.match(ctx)
    assert 4000 < len(store.tokens) <= 5000
