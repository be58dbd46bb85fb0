"""Exact tests of the pure-numpy sampler chain and the speculative accept/reject step (no model).

Losslessness is tested statistically: for each (p, q) case, 100,000 fixed-seed trials of the
accept/reject step, and a chi-square goodness-of-fit test of the emitted tokens against p at
significance ALPHA. Tokens with p = 0 must never be emitted (checked exactly).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from localspec.core.sampling import SamplerSettings, process, sample, verify

TRIALS = 100_000
ALPHA = 1e-3  # per test; seeds are fixed, so a pass is reproducible


def _draft(q_rows: list[np.ndarray], rng: np.random.Generator) -> list[int]:
    return [sample(q, rng) for q in q_rows]


def _assert_matches(counts: np.ndarray, p: np.ndarray) -> None:
    p = p.ravel()
    counts = counts.ravel()
    assert counts[p == 0].sum() == 0, "emitted a token the target gives probability 0"
    support = p > 0
    if support.sum() < 2:
        return
    expected = p[support] / p[support].sum() * counts.sum()
    result = chisquare(counts[support], expected)
    assert result.pvalue > ALPHA, f"chi-square p-value {result.pvalue:.2e}: {counts} vs {expected.round()}"


def _first_token_counts(p: np.ndarray, q: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Emitted first-token histogram when p and q are the same at every position."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(p.size, dtype=np.int64)
    for _ in range(TRIALS):
        tokens, _ = verify(lambda i: p, [q] * k, _draft([q] * k, rng), rng)
        counts[tokens[0]] += 1
    return counts


def _dirichlet(rng: np.random.Generator, n: int, zeros: int = 0) -> np.ndarray:
    x = rng.dirichlet(np.ones(n))
    x[rng.choice(n, zeros, replace=False)] = 0
    return x / x.sum()


CASES = {
    "p_equals_q": (np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.1, 0.2, 0.3, 0.4])),
    "disjoint_supports": (np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.3, 0.7])),
    "q_one_hot_in_support": (np.array([0.2, 0.5, 0.3, 0.0]), np.array([0.0, 1.0, 0.0, 0.0])),
    "q_one_hot_outside": (np.array([0.2, 0.5, 0.3, 0.0]), np.array([0.0, 0.0, 0.0, 1.0])),
    "p_zero_where_q_not": (np.array([0.0, 0.6, 0.0, 0.4, 0.0]), np.array([0.3, 0.1, 0.3, 0.1, 0.2])),
    "p_one_hot": (np.array([0.0, 0.0, 1.0, 0.0]), np.array([0.25, 0.25, 0.25, 0.25])),
    "q_sharper_than_p": (np.array([0.3, 0.3, 0.2, 0.2]), np.array([0.9, 0.05, 0.03, 0.02])),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("k", [1, 3])
def test_emitted_token_follows_p(name: str, k: int) -> None:
    p, q = CASES[name]
    _assert_matches(_first_token_counts(p, q, k, seed=k), p)


@pytest.mark.parametrize("seed", range(4))
def test_random_pairs_follow_p(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 9))
    p, q = _dirichlet(rng, n, zeros=seed % 2), _dirichlet(rng, n, zeros=(seed // 2) % 2 + 1)
    _assert_matches(_first_token_counts(p, q, 2, seed=seed), p)


def test_three_token_sequences_follow_p_cubed() -> None:
    """Whole streams: after repeated steps (with discards), the 3-token prefix is p x p x p."""
    rng = np.random.default_rng(7)
    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.1, 0.4, 0.4])
    counts = np.zeros((4, 4, 4), dtype=np.int64)
    for _ in range(TRIALS):
        out: list[int] = []
        while len(out) < 3:
            tokens, _ = verify(lambda i: p, [q, q], _draft([q, q], rng), rng)
            out += tokens
        counts[tuple(out[:3])] += 1
    _assert_matches(counts, np.einsum("i,j,k->ijk", p, p, p))


def test_position_dependent_rows() -> None:
    """p and q differ per position; the second emitted token must follow p_2 given an accepted first."""
    rng = np.random.default_rng(11)
    p_rows = [np.array([0.7, 0.2, 0.1]), np.array([0.1, 0.1, 0.8])]
    q_rows = [np.array([0.6, 0.3, 0.1]), np.array([0.5, 0.4, 0.1])]
    counts = np.zeros(3, dtype=np.int64)
    for _ in range(TRIALS):
        draft = _draft(q_rows[:1], rng)
        tokens, n = verify(lambda i: p_rows[i], q_rows[:1], draft, rng)
        if n == 1:  # accepted: tokens[1] is the bonus token, drawn from p_2
            counts[tokens[1]] += 1
    _assert_matches(counts, p_rows[1])


def test_all_accepted_when_p_equals_q_and_stats() -> None:
    rng = np.random.default_rng(3)
    p = np.array([0.25, 0.25, 0.5])
    for _ in range(1000):
        tokens, n = verify(lambda i: p, [p] * 4, _draft([p] * 4, rng), rng)
        assert n == 4 and len(tokens) == 5


def test_greedy_accepts_exactly_matching_prefix() -> None:
    rng = np.random.default_rng(0)
    s = SamplerSettings(temperature=0)
    target = [np.array([0.0, 3.0, 1.0]), np.array([2.0, 0.0, 1.0]), np.array([0.0, 0.0, 5.0])]
    p_at = lambda i: process(target[i], s)  # noqa: E731
    one_hot = lambda t: np.eye(3)[t]  # noqa: E731
    assert verify(p_at, [one_hot(1), one_hot(0)], [1, 0], rng) == ([1, 0, 2], 2)
    assert verify(p_at, [one_hot(1), one_hot(2)], [1, 2], rng) == ([1, 0], 1)
    assert verify(p_at, [one_hot(2), one_hot(0)], [2, 0], rng) == ([1], 0)


# ---- the sampler chain ---------------------------------------------------------------------


def _reference(logits: np.ndarray, s: SamplerSettings) -> np.ndarray:
    """A slow, obviously-correct chain: full sort, llama.cpp order (top-k, top-p, min-p, temp)."""
    order = np.argsort(-logits, kind="stable")
    if s.top_k > 0:
        order = order[: s.top_k]
    w = np.exp(logits[order] - logits[order[0]])
    w /= w.sum()
    if s.top_p < 1:
        cut = next(i for i, c in enumerate(np.cumsum(w)) if c >= s.top_p or i == len(w) - 1)
        order, w = order[: cut + 1], w[: cut + 1]
    if s.min_p > 0:
        order = order[w >= s.min_p * w[0]]
    out = np.zeros(logits.size)
    e = np.exp((logits[order] - logits[order[0]]) / s.temperature)
    out[order] = e / e.sum()
    return out


@pytest.mark.parametrize(
    "s",
    [
        SamplerSettings(1.0, 0, 1.0, 0.0),
        SamplerSettings(0.7, 40, 0.95, 0.05),
        SamplerSettings(1.3, 0, 0.9, 0.0),
        SamplerSettings(1.0, 5, 1.0, 0.0),
        SamplerSettings(0.5, 0, 1.0, 0.1),
        SamplerSettings(1.0, 0, 0.5, 0.02),
        SamplerSettings(2.0, 1000, 0.99, 0.0),
    ],
)
def test_chain_equals_reference(s: SamplerSettings) -> None:
    rng = np.random.default_rng(42)
    for n, scale in itertools.product([10, 5000, 151_936], [0.5, 3.0]):
        logits = rng.normal(size=n) * scale
        np.testing.assert_allclose(process(logits, s), _reference(logits, s), atol=1e-12)


def test_greedy_is_one_hot_argmax() -> None:
    logits = np.array([0.1, 2.0, -1.0, 1.9])
    assert process(logits, SamplerSettings(temperature=0)).token == 1


def test_minus_infinity_logits_never_sampled() -> None:
    logits = np.array([-np.inf, 0.0, 1.0, -np.inf])
    probs = process(logits, SamplerSettings(1.0, 0, 1.0, 0.0))
    assert probs[0] == probs[3] == 0 and probs.sum() == pytest.approx(1)


@pytest.mark.parametrize(
    "s",
    [
        SamplerSettings(0.8, 3, 1.0, 0.0),
        SamplerSettings(1.0, 0, 0.8, 0.0),
        SamplerSettings(1.0, 0, 1.0, 0.2),
        SamplerSettings(0.6, 4, 0.9, 0.05),
    ],
)
def test_transforms_applied_to_both_sides_stay_lossless(s: SamplerSettings) -> None:
    """p and q come from different logits through the same chain; output must follow p."""
    rng = np.random.default_rng(5)
    lp, lq = rng.normal(size=8) * 1.5, rng.normal(size=8) * 1.5
    p, q = process(lp, s), process(lq, s)
    _assert_matches(_first_token_counts(p, q, 2, seed=9), p)


def test_sample_follows_weights() -> None:
    rng = np.random.default_rng(1)
    w = np.array([1.0, 0.0, 3.0, 6.0])
    counts = np.bincount([sample(w, rng) for _ in range(TRIALS)], minlength=4)
    _assert_matches(counts, w / w.sum())


def test_one_hot_q_behaves_like_dense_one_hot() -> None:
    from localspec.core.sampling import OneHot

    p = np.array([0.2, 0.5, 0.3, 0.0])
    dense = np.eye(4)[1]
    assert OneHot(1)[1] == 1.0 and OneHot(1)[2] == 0.0
    np.testing.assert_array_equal(p - OneHot(1), p - dense)
    counts = np.zeros(4, dtype=np.int64)
    rng = np.random.default_rng(21)
    for _ in range(TRIALS):
        tokens, _ = verify(lambda i: p, [OneHot(1)], [1], rng)
        counts[tokens[0]] += 1
    _assert_matches(counts, p)
