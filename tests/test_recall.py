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
