"""Exact tests of the pure-numpy sampler chain and both samplings' verify steps (no model).

Losslessness is tested statistically: for each (p, q) case, fixed-seed trials of the verify step
(50,000 for rejection sampling, 20,000 for invariant sampling, whose noise is hashed per position),
and a chi-square goodness-of-fit test of the emitted tokens against p at significance ALPHA. Tokens
with p = 0 must never be emitted (checked exactly). Invariant sampling must also emit, at every
position, the token the target alone would: whatever was drafted.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from localspec.core.sampling import (
    InvariantSampling,
    OneHot,
    RejectionSampling,
    SamplerSettings,
    Sampling,
    dense,
    process,
    sample,
)

TRIALS = 50_000
INVARIANT_TRIALS = 20_000
ALPHA = 1e-3  # per test; seeds are fixed, so a pass is reproducible


def _round(s: Sampling, p_rows, q_rows, pos: int) -> tuple[list[int], int]:
    """Draft from q (the sampling's own pick, at the positions the draft will take) and verify against p."""
    draft = [s.pick(q, pos + j) for j, q in enumerate(q_rows)]
    return s.verify(lambda i: p_rows[i], q_rows, draft, pos)


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
    """Rejection sampling's emitted first-token histogram when p and q are the same at every position."""
    s = RejectionSampling(seed)
    counts = np.zeros(p.size, dtype=np.int64)
    for _ in range(TRIALS):
        tokens, _ = _round(s, [p] * (k + 1), [q] * k, pos=0)
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


# ---- rejection sampling ----------------------------------------------------------------------
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
    s = RejectionSampling(7)
    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.1, 0.4, 0.4])
    counts = np.zeros((4, 4, 4), dtype=np.int64)
    for _ in range(TRIALS):
        out: list[int] = []
        while len(out) < 3:
            out += _round(s, [p] * 3, [q, q], pos=len(out))[0]
        counts[tuple(out[:3])] += 1
    _assert_matches(counts, np.einsum("i,j,k->ijk", p, p, p))


def test_position_dependent_rows() -> None:
    """p and q differ per position; the second emitted token must follow p_2 given an accepted first."""
    s = RejectionSampling(11)
    p_rows = [np.array([0.7, 0.2, 0.1]), np.array([0.1, 0.1, 0.8])]
    q_rows = [np.array([0.6, 0.3, 0.1]), np.array([0.5, 0.4, 0.1])]
    counts = np.zeros(3, dtype=np.int64)
    for _ in range(TRIALS):
        tokens, n = _round(s, p_rows, q_rows[:1], pos=0)
        if n == 1:  # accepted: tokens[1] is the bonus token, drawn from p_2
            counts[tokens[1]] += 1
    _assert_matches(counts, p_rows[1])


# ---- invariant sampling ----------------------------------------------------------------------
def _pick_counts(p: np.ndarray, seed: int, trials: int = INVARIANT_TRIALS) -> np.ndarray:
    s = InvariantSampling(seed)
    return np.bincount([s.pick(p, pos) for pos in range(trials)], minlength=p.size)


@pytest.mark.parametrize("name", CASES)
def test_invariant_pick_follows_p(name: str) -> None:
    """Gumbel-max with keyed noise is an exact sample of p at each position (positions independent)."""
    p, q = CASES[name]
    _assert_matches(_pick_counts(p, seed=len(name)), p)
    _assert_matches(_pick_counts(q, seed=len(name) + 1), q)


def test_invariant_pairs_of_positions_are_independent() -> None:
    """The tokens at neighbouring positions are independent draws: pairs follow p x p."""
    p = np.array([0.5, 0.3, 0.2])
    s = InvariantSampling(17)
    tokens = [s.pick(p, pos) for pos in range(2 * INVARIANT_TRIALS)]
    counts = np.zeros((3, 3), dtype=np.int64)
    np.add.at(counts, (tokens[0::2], tokens[1::2]), 1)
    _assert_matches(counts, np.outer(p, p))


def test_invariant_tokens_do_not_depend_on_the_drafts() -> None:
    """Whatever is drafted (nothing, copies right or wrong, a model's samples, any lengths), invariant
    sampling emits at each position the token the target alone emits there: with the pick test above,
    the output follows p exactly."""
    rng = np.random.default_rng(5)
    n, length = 50, 300
    p_rows = [_dirichlet(rng, n, zeros=10) for _ in range(length + 70)]
    q_rows = [_dirichlet(rng, n, zeros=5) for _ in range(length + 70)]
    alone = [InvariantSampling(99).pick(p_rows[i], i) for i in range(length)]
    for style in ("copies", "model", "mixed"):
        s, out = InvariantSampling(99), []
        while len(out) < length:
            pos, k = len(out), int(rng.integers(0, 9))
            if style == "copies" or (style == "mixed" and rng.random() < 0.5):
                draft = [t if rng.random() < 0.7 else int(rng.integers(n)) for t in alone[pos : pos + k]]
                q = [OneHot(t) for t in draft]
            else:
                q = q_rows[pos : pos + k]
                draft = [s.pick(qj, pos + j) for j, qj in enumerate(q)]
            tokens, _ = s.verify(lambda i, pos=pos: p_rows[pos + i], q, draft, pos)
            out += tokens
        assert out[:length] == alone
    other = [InvariantSampling(100).pick(p_rows[i], i) for i in range(length)]
    assert other != alone  # another seed, another text


def test_invariant_model_drafts_are_accepted_as_the_coupling_promises() -> None:
    """A model draft drawn with the target's noise is accepted with probability >= (1 - TV) / (1 + TV)."""
    rng = np.random.default_rng(8)
    p, q = _dirichlet(rng, 12), _dirichlet(rng, 12)
    tv = 0.5 * np.abs(p - q).sum()
    s = InvariantSampling(4)
    accepted = sum(_round(s, [p, p], [q], pos=2 * t)[1] for t in range(INVARIANT_TRIALS))
    rate, sd = accepted / INVARIANT_TRIALS, 0.5 / np.sqrt(INVARIANT_TRIALS)
    assert rate > (1 - tv) / (1 + tv) - 4 * sd


@pytest.mark.parametrize("kind", [RejectionSampling, InvariantSampling])
def test_all_accepted_when_p_equals_q(kind: type[Sampling]) -> None:
    s = kind(3)
    p = np.array([0.25, 0.25, 0.5])
    for trial in range(1000):
        tokens, n = _round(s, [p] * 5, [p] * 4, pos=trial * 5)
        assert n == 4 and len(tokens) == 5


@pytest.mark.parametrize("kind", [RejectionSampling, InvariantSampling])
def test_greedy_accepts_exactly_matching_prefix(kind: type[Sampling]) -> None:
    s = SamplerSettings(temperature=0)
    target = [np.array([0.0, 3.0, 1.0]), np.array([2.0, 0.0, 1.0]), np.array([0.0, 0.0, 5.0])]
    p_at = lambda i: process(target[i], s)  # noqa: E731
    v = kind(0).verify
    assert v(p_at, [OneHot(1), OneHot(0)], [1, 0], 0) == ([1, 0, 2], 2)
    assert v(p_at, [OneHot(1), OneHot(2)], [1, 2], 0) == ([1, 0], 1)
    assert v(p_at, [OneHot(2), OneHot(0)], [2, 0], 0) == ([1], 0)


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
        np.testing.assert_allclose(dense(process(logits, s), n), _reference(logits, s), atol=1e-12)


def test_greedy_is_one_hot_argmax() -> None:
    logits = np.array([0.1, 2.0, -1.0, 1.9])
    assert process(logits, SamplerSettings(temperature=0)).token == 1


def test_minus_infinity_logits_never_sampled() -> None:
    logits = np.array([-np.inf, 0.0, 1.0, -np.inf])
    probs = dense(process(logits, SamplerSettings(1.0, 0, 1.0, 0.0)), 4)
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
    p, q = dense(process(lp, s), 8), dense(process(lq, s), 8)
    _assert_matches(_first_token_counts(p, q, 2, seed=9), p)
    _assert_matches(_pick_counts(p, seed=9), p)


def test_sample_follows_weights() -> None:
    rng = np.random.default_rng(1)
    w = np.array([1.0, 0.0, 3.0, 6.0])
    counts = np.bincount([sample(w, rng) for _ in range(TRIALS)], minlength=4)
    _assert_matches(counts, w / w.sum())


@pytest.mark.parametrize("kind", [RejectionSampling, InvariantSampling])
def test_a_copied_token_is_accepted_with_probability_p(kind: type[Sampling]) -> None:
    """A copy (one-hot q) is accepted with probability p(x) under both samplings; the output follows p."""
    p = np.array([0.2, 0.5, 0.3, 0.0])
    assert OneHot(1)[1] == 1.0 and OneHot(1)[2] == 0.0
    np.testing.assert_array_equal(dense(OneHot(1), 4), np.eye(4)[1])
    counts, accepted = np.zeros(4, dtype=np.int64), 0
    s = kind(21)
    for trial in range(INVARIANT_TRIALS):
        tokens, n = s.verify(lambda i: p, [OneHot(1)], [1], 2 * trial)
        counts[tokens[0]] += 1
        accepted += n
    _assert_matches(counts, p)
    assert accepted / INVARIANT_TRIALS == pytest.approx(p[1], abs=4 * 0.5 / np.sqrt(INVARIANT_TRIALS))
