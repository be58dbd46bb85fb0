"""Pure-numpy sampling: the sampler chain, token sampling and the speculative accept/reject step.

Nothing here touches llama.cpp, so every rule can be tested exhaustively on small vocabularies.
The chain follows llama.cpp's default order: top-k, top-p, min-p (all on the temperature-1
softmax), then temperature on the survivors. Temperature 0 is greedy: one-hot at the argmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplerSettings:
    """Sampler parameters, applied identically to target (p) and draft (q) logits."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class OneHot:
    """A one-hot distribution at `token` (an n-gram draft, or greedy sampling) with no vocabulary-sized array."""

    __array_ufunc__ = None  # make `p - q` call __rsub__ below

    def __init__(self, token: int) -> None:
        self.token = token

    def __getitem__(self, x: int) -> float:
        return 1.0 if x == self.token else 0.0

    def __rsub__(self, p: np.ndarray) -> np.ndarray:
        out = np.array(p, dtype=np.float64)
        out[self.token] -= 1.0
        return out


Dist = np.ndarray | OneHot  # a sampling distribution over the target's vocabulary


def _sorted_prefix(logits: np.ndarray, cand: np.ndarray, z: float, lmax: float, top_p: float) -> np.ndarray:
    """The candidates sorted by descending logit, cut to the smallest prefix with mass >= top_p.

    Sorts only as many of the largest candidates as needed (argpartition first), so a
    full-vocabulary top-p stays cheap; the result is the same as sorting everything.
    """
    m = 256
    while True:
        part = cand[np.argpartition(-logits[cand], m - 1)[:m]] if m < cand.size else cand
        order = part[np.argsort(-logits[part], kind="stable")]
        cum = np.cumsum(np.exp(logits[order] - lmax)) / z
        cut = int(np.searchsorted(cum, top_p))  # first index with cum >= top_p
        if cut < order.size or part is cand:
            return order[: min(cut + 1, order.size)]
        m *= 16


def process(logits: np.ndarray, s: SamplerSettings) -> np.ndarray | OneHot:
    """Raw logits -> the sampling distribution after the sampler chain (dense float64, sums to 1).

    Greedy (temperature 0) gives a OneHot at the argmax: no vocabulary-sized array per position.
    """
    if s.greedy:
        return OneHot(int(np.argmax(logits)))
    logits = np.asarray(logits, dtype=np.float64)
    probs = np.zeros(logits.size)
    cand = np.flatnonzero(np.isfinite(logits))
    if 0 < s.top_k < cand.size:
        cand = cand[np.argpartition(-logits[cand], s.top_k - 1)[: s.top_k]]
    lmax = float(logits[cand].max())
    z = float(np.exp(logits[cand] - lmax).sum())  # top-p mass is relative to the post-top-k set
    if s.min_p > 0:  # p_i / p_max >= min_p, a prefix of the sorted order like top-p
        cand = cand[logits[cand] >= lmax + math.log(s.min_p)]
    if s.top_p < 1.0:
        cand = _sorted_prefix(logits, cand, z, lmax, s.top_p)
    w = np.exp((logits[cand] - lmax) / s.temperature)
    probs[cand] = w / w.sum()
    return probs


def sample(probs: np.ndarray | OneHot, rng: np.random.Generator) -> int:
    """One token drawn from a (not necessarily normalized) non-negative weight vector."""
    if isinstance(probs, OneHot):
        return probs.token
    cdf = np.cumsum(probs)
    return int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))


def verify(
    p_at: Callable[[int], Dist], q: Sequence[Dist], draft: Sequence[int], rng: np.random.Generator
) -> tuple[list[int], int]:
    """Speculative rejection sampling (Leviathan et al. 2022, Algorithm 1).

    p_at(i) is the target distribution at draft position i (i = len(draft) is the bonus
    position); it is called lazily, so rows after the first rejection are never computed.
    q[i] is the draft distribution that draft[i] was sampled from (one-hot for n-gram drafts).
    Returns the emitted tokens (accepted prefix plus one corrected or bonus token) and the
    number of draft tokens accepted. The emitted tokens are distributed exactly as p.
    """
    for i, x in enumerate(draft):
        p = p_at(i)
        if rng.random() * q[i][x] < p[x]:  # accept with probability min(1, p(x) / q(x))
            continue
        if isinstance(p, OneHot):  # a rejection leaves all of a one-hot p's residual mass on its token
            return [*draft[:i], p.token], i
        residual = np.maximum(p - q[i], 0.0)
        return [*draft[:i], sample(residual if residual.sum() > 0 else p, rng)], i
    return [*draft, sample(p_at(len(draft)), rng)], len(draft)
