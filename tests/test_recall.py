"""Drafting from earlier answers without a model: the store's matches, bound and file, and the drafter following."""

from __future__ import annotations

from pathlib import Path

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
    path.write_bytes(b"not a numpy file")
    assert len(AnswerStore(path).tokens) == 0  # damaged: starts afresh


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
