"""Exact tests of the pure-numpy sampler chain and of drafter-invariant sampling (no model).

Losslessness is shown in two parts. The token picked at a position follows p: a chi-square
goodness-of-fit test of 20,000 fixed-seed picks (one per position) against p, at significance ALPHA,
and tokens with p = 0 are never picked (checked exactly). And verification emits, at every position,
the token the target alone picks there, whatever was drafted (checked exactly).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from localspec.core.sampling import (
    InvariantSampling,
    OneHot,
    Probs,
    SamplerSettings,
    _gumbel_one,
    _key,
    gumbel,
    process,
    support,
)

TRIALS = 20_000
ALPHA = 1e-3  # per test; seeds are fixed, so a pass is reproducible


def dense(d, n: int) -> np.ndarray:
    ids, p = support(d)
    out = np.zeros(n)
    out[ids] = p
    return out


def _round(s: InvariantSampling, p_rows, q_rows, pos: int) -> tuple[list[int], int]:
    """Draft from q (picked with the target's noise, at the positions the draft will take) and verify against p."""
    draft = [s.pick(q, pos + j) for j, q in enumerate(q_rows)]
    return s.verify(lambda i: p_rows[i], draft, pos)


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


# ---- invariant sampling ----------------------------------------------------------------------
def _pick_counts(p: np.ndarray, seed: int, trials: int = TRIALS) -> np.ndarray:
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
    tokens = [s.pick(p, pos) for pos in range(2 * TRIALS)]
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
        s, out = InvariantSampling(99), list[int]()
        while len(out) < length:
            pos, k = len(out), int(rng.integers(0, 9))
            if style == "copies" or (style == "mixed" and rng.random() < 0.5):
                draft = [t if rng.random() < 0.7 else int(rng.integers(n)) for t in alone[pos : pos + k]]
            else:
                draft = [s.pick(q, pos + j) for j, q in enumerate(q_rows[pos : pos + k])]
            tokens, _ = s.verify(lambda i, at=pos: p_rows[at + i], draft, pos)  # type: ignore[misc]
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
    accepted = sum(_round(s, [p, p], [q], pos=2 * t)[1] for t in range(TRIALS))
    rate, sd = accepted / TRIALS, 0.5 / np.sqrt(TRIALS)
    assert rate > (1 - tv) / (1 + tv) - 4 * sd


def test_all_accepted_when_p_equals_q() -> None:
    s = InvariantSampling(3)
    p = np.array([0.25, 0.25, 0.5])
    for trial in range(1000):
        tokens, n = _round(s, [p] * 5, [p] * 4, pos=trial * 5)
        assert n == 4 and len(tokens) == 5


def test_greedy_accepts_exactly_matching_prefix() -> None:
    s = SamplerSettings(temperature=0)
    target = [np.array([0.0, 3.0, 1.0]), np.array([2.0, 0.0, 1.0]), np.array([0.0, 0.0, 5.0])]
    p_at = lambda i: process(target[i], s)  # noqa: E731
    v = InvariantSampling(0).verify
    assert v(p_at, [1, 0], 0) == ([1, 0, 2], 2)
    assert v(p_at, [1, 2], 0) == ([1, 0], 1)
    assert v(p_at, [2, 0], 0) == ([1], 0)


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


def test_a_probability_under_the_smallest_float_is_never_picked() -> None:
    """At a low temperature a wide top-k set's tail underflows to probability 0: kept in the support (as the
    full-vocabulary chain keeps it), never picked, and no error."""
    logits = np.array([0.0, -40.0, -80.0, 10.0], dtype=np.float32)
    d = process(logits, SamplerSettings(temperature=0.05, top_k=4, top_p=1.0, min_p=0.0))
    assert isinstance(d, Probs) and 0.0 in d.p
    assert {InvariantSampling(1).pick(d, pos) for pos in range(50)} == {3}


def test_greedy_is_one_hot_argmax() -> None:
    logits = np.array([0.1, 2.0, -1.0, 1.9])
    greedy = process(logits, SamplerSettings(temperature=0))
    assert isinstance(greedy, OneHot) and greedy.token == 1


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
    p, q = process(lp, s), process(lq, s)
    sampling, counts = InvariantSampling(9), np.zeros(8, dtype=np.int64)
    for trial in range(TRIALS):
        counts[_round(sampling, [p] * 3, [q] * 2, pos=3 * trial)[0][0]] += 1
    _assert_matches(counts, dense(p, 8))


def test_keyed_gumbel_noise() -> None:
    """Standard Gumbel moments; a row per position, independent of the ids asked for alongside."""
    g = gumbel(1, np.arange(100_000), np.arange(3))
    assert g.shape == (100_000, 3)
    assert abs(g.mean() - np.euler_gamma) < 0.02 and abs(g.var() - np.pi**2 / 6) < 0.05
    assert abs(np.corrcoef(g[:, 0], g[:, 1])[0, 1]) < 0.02 and abs(np.corrcoef(g[:-1, 0], g[1:, 0])[0, 1]) < 0.02
    np.testing.assert_array_equal(gumbel(1, 7, np.array([2])), gumbel(1, 7, np.arange(5))[2:3])
    assert not np.array_equal(gumbel(1, 7, np.arange(5)), gumbel(2, 7, np.arange(5)))
    ids = np.arange(0, 262_144, 997)  # one token's noise in Python numbers (a small set's pick): the same hash
    np.testing.assert_allclose([_gumbel_one(_key(3, 11), int(i)) for i in ids], gumbel(3, 11, ids), rtol=1e-14)


def test_a_copied_token_is_accepted_with_probability_p() -> None:
    """A copy is accepted with probability p(x), as under rejection sampling; the output follows p."""
    p = np.array([0.2, 0.5, 0.3, 0.0])
    np.testing.assert_array_equal(dense(OneHot(1), 4), np.eye(4)[1])
    counts, accepted = np.zeros(4, dtype=np.int64), 0
    s = InvariantSampling(21)
    for trial in range(TRIALS):
        tokens, n = s.verify(lambda i: p, [1], 2 * trial)
        counts[tokens[0]] += 1
        accepted += n
    _assert_matches(counts, p)
    assert accepted / TRIALS == pytest.approx(p[1], abs=4 * 0.5 / np.sqrt(TRIALS))
