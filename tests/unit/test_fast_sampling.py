"""The sampler chain's fast path held to the full-vocabulary reference, exactly (no model but in the last test).

`process` finds its candidates by thresholds and sorts only as far as a cut; `reference_sampling.process_reference`
is the same chain over the whole vocabulary with every order defined, and `process_before` the chain as it was
(argpartition's order: equal but for ties and the last bit of a sum). Each case compares the support (ids in
order) exactly, the probabilities to their last bits, and the token invariant sampling picks at many positions.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.reference_sampling import SAMPLERS, assert_same, process_before, process_reference

from localspec.core.sampling import InvariantSampling, SamplerSettings, process, support, top_probability

VOCAB = 151_936


def _logits(rng: np.random.Generator, kind: str, n: int = VOCAB) -> np.ndarray:
    """Logits shaped like a language model's (a few likely tokens over a wide, low bulk), with variants."""
    x: np.ndarray = (rng.standard_normal(n) * 2.0).astype(np.float32)
    peaks = min(12, n // 2)
    x[rng.choice(n, peaks, replace=False)] += rng.uniform(4, 14, peaks).astype(np.float32)
    if kind == "ties":  # many equal logits, the cuts falling among them
        x = np.round(x * 2) / 2
    elif kind == "masked":  # a grammar allows a few tokens
        allowed = rng.choice(n, min(7, n), replace=False)
        x[np.setdiff1d(np.arange(n), allowed)] = -np.inf
    elif kind == "half-masked":
        masked = rng.random(n) < 0.5
        masked[0] &= not masked.all()  # a grammar always allows one token at least
        x[masked] = -np.inf
    elif kind == "flat":  # an unsure model: the nucleus spans thousands of tokens
        x = (rng.standard_normal(n) * 0.3).astype(np.float32)
    elif kind == "float64":
        return np.asarray(x, np.float64) + rng.standard_normal(n) * 1e-3
    return x


KINDS = ["lm", "ties", "masked", "half-masked", "flat", "float64"]


@pytest.mark.parametrize(("s", "kind"), list(itertools.product(SAMPLERS, KINDS)))
def test_fast_chain_equals_the_reference(s: SamplerSettings, kind: str) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{kind} {s}".encode()))  # a fixed seed per case
    for _ in range(4):
        logits = _logits(rng, kind)
        assert_same(process(logits, s), process_reference(logits, s))


@pytest.mark.parametrize("s", SAMPLERS)
def test_fast_chain_picks_what_the_chain_before_it_picked(s: SamplerSettings) -> None:
    """Against the chain as it was: the same support, probabilities within a sum's rounding, the same tokens."""
    rng = np.random.default_rng(7)
    sampling = InvariantSampling(11)
    for trial in range(6):
        logits = _logits(rng, "lm")
        got, before = process(logits, s), process_before(logits, s)
        ids, p = support(got)
        order = np.argsort(support(before)[0])
        np.testing.assert_array_equal(ids, support(before)[0][order])
        np.testing.assert_allclose(p, support(before)[1][order], rtol=1e-12, atol=0)
        for pos in range(200):
            assert sampling.pick(got, 1000 * trial + pos) == sampling.pick(before, 1000 * trial + pos)


@settings(max_examples=300, deadline=None, derandomize=True)  # the same 300 cases every run
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([5, 50, 400, 5000]),
    st.floats(0.01, 3.0),
    st.sampled_from([0, 1, 2, 10, 40, 1000]),
    st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.1]),
    st.sampled_from([0.0, 0.01, 0.05, 0.3]),
    st.sampled_from(["lm", "ties", "masked", "half-masked", "float64"]),
)
def test_fast_chain_equals_the_reference_on_any_vocabulary(
    seed: int, n: int, temperature: float, top_k: int, top_p: float, min_p: float, kind: str
) -> None:
    rng = np.random.default_rng(seed)
    logits = _logits(rng, kind, n)
    s = SamplerSettings(temperature, top_k, top_p, min_p)
    assert_same(process(logits, s), process_reference(logits, s))


def test_a_nucleus_at_the_float32_bounds_edge_takes_the_exact_mass() -> None:
    """Where the top-p cut lies within the float32 mass's error, the exact float64 mass decides (as the
    reference does): a cut placed exactly at a candidate's cumulative mass."""
    rng = np.random.default_rng(3)
    logits = _logits(rng, "lm")
    order = np.argsort(-logits, kind="stable")
    lmax = float(logits.max())
    z = float(np.exp(logits.astype(np.float64) - lmax).sum())
    cum = np.cumsum(np.exp(logits[order[:50]].astype(np.float64) - lmax)) / z
    for top_p in (float(cum[3]), float(np.nextafter(cum[3], 1)), float(np.nextafter(cum[3], 0))):
        s = SamplerSettings(1.0, 0, top_p, 0.0)
        assert_same(process(logits, s), process_reference(logits, s))


def test_top_probability_estimates_the_softmax_top() -> None:
    """The planner's estimate of how sure the target is (its top probability at temperature 1, the mass near the
    top exact, the rest sampled): within 0.02 of the exact softmax on every shape of row, exact under a mask."""
    rng = np.random.default_rng(1)
    for kind, scale in itertools.product(["lm", "ties", "half-masked", "flat"], [0.3, 1.0, 3.0]):
        logits = _logits(rng, kind) * np.float32(scale)
        x = logits.astype(np.float64)
        assert top_probability(logits) == pytest.approx(1 / np.exp(x - x.max()).sum(), abs=0.02), (kind, scale)
    masked = _logits(rng, "masked")
    x = masked.astype(np.float64)
    assert top_probability(masked) == pytest.approx(1 / np.exp(x - x.max()).sum(), rel=1e-6)
