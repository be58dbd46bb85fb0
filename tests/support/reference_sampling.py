"""The sampler chain as it was before its fast path: full-vocabulary numpy, kept as the reference the fast
path (localspec.core.sampling.process) is held to, token for token (tests/unit/test_fast_sampling.py)."""

from __future__ import annotations

import math

import numpy as np

from localspec.core.sampling import OneHot, Probs, SamplerSettings, support


def _sorted_prefix(logits: np.ndarray, cand: np.ndarray, z: float, lmax: float, top_p: float) -> np.ndarray:
    m = 256
    while True:
        part = cand[np.argpartition(-logits[cand], m - 1)[:m]] if m < cand.size else cand
        order = part[np.argsort(-logits[part], kind="stable")]
        cum = np.cumsum(np.exp(logits[order].astype(np.float64) - lmax)) / z
        cut = int(np.searchsorted(cum, top_p))  # first index with cum >= top_p
        if cut < order.size or part is cand:
            return order[: min(cut + 1, order.size)]
        m *= 16


def process_before(logits: np.ndarray, s: SamplerSettings) -> Probs | OneHot:
    """The chain as it was, verbatim: argpartition over the whole vocabulary, its order as numpy leaves it."""
    if s.greedy:
        return OneHot(int(np.argmax(logits)))
    n = logits.size
    if 0 < s.top_k < n:
        cand = np.argpartition(logits, n - s.top_k)[n - s.top_k :]
        cand = cand[np.isfinite(logits[cand])]
    else:
        cand = np.flatnonzero(np.isfinite(logits))
    lc = logits[cand].astype(np.float64)
    lmax = float(lc.max())
    w = np.exp(lc - lmax)
    z = float(w.sum())  # top-p mass is relative to the post-top-k set
    if s.min_p > 0:  # p_i / p_max >= min_p, a prefix of the sorted order like top-p
        keep = lc >= lmax + math.log(s.min_p)
        cand = cand[keep]
    if s.top_p < 1.0:
        cand = _sorted_prefix(logits, cand, z, lmax, s.top_p)
    w = np.exp((logits[cand].astype(np.float64) - lmax) / s.temperature)
    return Probs(cand.astype(np.int64), w / w.sum())


def _ranked(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ids (ascending) by descending logit, ties by ascending id."""
    return ids[np.argsort(-logits[ids], kind="stable")]


def process_reference(logits: np.ndarray, s: SamplerSettings) -> Probs | OneHot:
    """The same chain over the whole vocabulary with every order defined: candidates by ascending id where a
    mass is summed and where they are returned, by descending logit (ties: the lower id first) where top-k and
    top-p cut.
    It is `process_before` with numpy's partition order replaced by that rule (equal but for ties and the last
    bit of a sum's rounding)."""
    if s.greedy:
        return OneHot(int(np.argmax(logits)))
    cand = np.flatnonzero(np.isfinite(logits))
    if 0 < s.top_k < cand.size:
        cand = np.sort(_ranked(logits, cand)[: s.top_k])
    lc = logits[cand].astype(np.float64)
    lmax = float(lc.max())
    z = float(np.exp(lc - lmax).sum())
    if s.min_p > 0:
        cand = cand[lc >= lmax + math.log(s.min_p)]
    order = _ranked(logits, cand)
    if s.top_p < 1.0:
        cum = np.cumsum(np.exp(logits[order].astype(np.float64) - lmax)) / z
        order = order[: min(int(np.searchsorted(cum, s.top_p)) + 1, order.size)]
    order = np.sort(order)
    w = np.exp((logits[order].astype(np.float64) - lmax) / s.temperature)
    return Probs(order.astype(np.int64), w / w.sum())


# Sampler settings the fast chain is held to the reference under: each cut alone, together, none.
SAMPLERS = [
    SamplerSettings(0.8, 40, 0.95, 0.05),  # the default chain
    SamplerSettings(0.8, 0, 0.95, 0.05),  # top-k 0
    SamplerSettings(1.0, 0, 0.9, 0.0),  # top-k 0, min-p 0
    SamplerSettings(1.0, 0, 1.0, 0.1),  # min-p alone
    SamplerSettings(0.7, 5, 1.0, 0.0),  # top-k alone
    SamplerSettings(1.5, 100, 0.99, 0.0),
    SamplerSettings(2.0, 40, 1.0, 0.02),  # high temperature
    SamplerSettings(0.05, 40, 0.5, 0.0),  # low temperature, a tight nucleus
    SamplerSettings(0.0),  # greedy
]


def assert_same(got: Probs | OneHot, want: Probs | OneHot) -> None:
    """The same support, and probabilities within a few units in the last place."""
    if isinstance(want, OneHot):
        assert isinstance(got, OneHot) and got.token == want.token
        return
    np.testing.assert_array_equal(support(got)[0], support(want)[0])
    # within a few units in the last place: a small set's chain runs in Python floats (libm's exp, a plain sum)
    np.testing.assert_allclose(support(got)[1], support(want)[1], rtol=1e-14, atol=0)
