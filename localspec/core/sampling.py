"""Pure-numpy sampling: the sampler chain, and the two ways of choosing and verifying tokens.

Nothing here touches llama.cpp, so every rule can be tested exhaustively on small vocabularies.
The chain follows llama.cpp's default order: top-k, top-p, min-p (all on the temperature-1
softmax), then temperature on the survivors. Temperature 0 is greedy: one-hot at the argmax.

Two samplings keep the output exactly the target's distribution:
- `InvariantSampling` (the default): the token at each position is argmax(log p + g), with Gumbel
  noise g keyed by (seed, position, token id). It is a function of the seed, the position and the
  target's distribution only, so the same seed gives the same text whatever was drafted. A draft
  token is accepted iff it is that token; a model drafts argmax(log q + g) with the same g.
- `RejectionSampling`: Leviathan et al.'s accept/reject step on a sequential random stream.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
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
    """A one-hot distribution at `token` (a copied draft, or greedy sampling)."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.ids = np.array([token], dtype=np.int64)
        self.p = np.ones(1)

    def __getitem__(self, x: int) -> float:
        return 1.0 if x == self.token else 0.0


class Probs:
    """A distribution over the vocabulary kept as its support: token ids and their probabilities.

    The chain leaves a few dozen tokens; keeping only those (no vocabulary-sized array per position)
    keeps a wide verify cheap.
    """

    def __init__(self, ids: np.ndarray, p: np.ndarray, n_vocab: int) -> None:
        self.ids, self.p, self.n_vocab = ids, p, n_vocab

    def __getitem__(self, x: int) -> float:
        hit = np.flatnonzero(self.ids == x)
        return float(self.p[hit[0]]) if hit.size else 0.0


Dist = Probs | OneHot | np.ndarray  # a sampling distribution over the vocabulary (dense arrays: tests)


def dense(d: Dist, n_vocab: int) -> np.ndarray:
    """The distribution as a vocabulary-sized float64 array."""
    if isinstance(d, np.ndarray):
        return np.asarray(d, dtype=np.float64)
    out = np.zeros(n_vocab)
    out[d.ids] = d.p
    return out


def support(d: Dist) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities) of the tokens with probability > 0."""
    if isinstance(d, np.ndarray):
        ids = np.flatnonzero(d > 0)
        return ids, np.asarray(d[ids], dtype=np.float64)
    return d.ids, d.p


def _sorted_prefix(logits: np.ndarray, cand: np.ndarray, z: float, lmax: float, top_p: float) -> np.ndarray:
    """The candidates sorted by descending logit, cut to the smallest prefix with mass >= top_p.

    Sorts only as many of the largest candidates as needed (argpartition first), so a
    full-vocabulary top-p stays cheap; the result is the same as sorting everything.
    """
    m = 256
    while True:
        part = cand[np.argpartition(-logits[cand], m - 1)[:m]] if m < cand.size else cand
        order = part[np.argsort(-logits[part], kind="stable")]
        cum = np.cumsum(np.exp(logits[order].astype(np.float64) - lmax)) / z
        cut = int(np.searchsorted(cum, top_p))  # first index with cum >= top_p
        if cut < order.size or part is cand:
            return order[: min(cut + 1, order.size)]
        m *= 16


def process(logits: np.ndarray, s: SamplerSettings) -> Probs | OneHot:
    """Raw logits -> the sampling distribution after the sampler chain (its support, summing to 1).

    Greedy (temperature 0) gives a OneHot at the argmax.
    """
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
    return Probs(cand.astype(np.int64), w / w.sum(), n)


def sample(probs: Dist, rng: np.random.Generator) -> int:
    """One token drawn from a (not necessarily normalized) non-negative weight vector or distribution."""
    if isinstance(probs, OneHot):
        return probs.token
    cdf = np.cumsum(probs if isinstance(probs, np.ndarray) else probs.p)
    i = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), cdf.size - 1)
    return i if isinstance(probs, np.ndarray) else int(probs.ids[i])


# ---- keyed Gumbel noise ------------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, vectorized (uint64 arithmetic wraps)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def gumbel(seed: int, pos: int | np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Standard Gumbel noise for token `ids` at context position `pos`: a pure function of its key.

    A counter-based hash (splitmix64 of seed, position and id), so the noise of any token at any
    position is computed on its own, in any order, and only for the tokens that need it. An array of
    positions gives one row per position.
    """
    start = np.uint64((int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK)
    with np.errstate(over="ignore"):
        key = start + np.asarray(pos, dtype=np.uint64)[..., None] * np.uint64(0xD1B54A32D192ED03)
        z = _mix(np.asarray(ids, dtype=np.uint64) * _GOLDEN + _mix(key))
    u = ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # uniform in (0, 1)
    g = -np.log(-np.log(u))
    return g


def gumbel_scores(d: Dist, seed: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, log p + g): the perturbed scores whose argmax is the token chosen at pos."""
    ids, p = support(d)
    return ids, np.log(p) + gumbel(seed, pos, ids)


# ---- choosing and verifying tokens ---------------------------------------------------------------
PAt = Callable[[int], Dist]  # the target's distribution at draft position i (computed lazily)


class Sampling(ABC):
    """How tokens are drawn: by drafters (`pick`) and by the target verifying a draft (`verify`)."""

    name = "sampling"

    def __init__(self, seed: int) -> None:
        self.seed = seed

    @abstractmethod
    def pick(self, d: Dist, pos: int) -> int:
        """A token drawn from d for context position pos."""

    @abstractmethod
    def verify(self, p_at: PAt, q: Sequence[Dist], draft: Sequence[int], pos: int) -> tuple[list[int], int]:
        """(emitted tokens, accepted draft tokens) for a draft placed at context positions pos, pos + 1, ...

        The emitted tokens are the accepted prefix plus one corrected or bonus token, distributed as p.
        """


class InvariantSampling(Sampling):
    """Gumbel-max with noise keyed by (seed, position, token id): the text depends on nothing else.

    A copied token x (one-hot q) is accepted with probability p(x), as under rejection sampling; a
    model draft drawn with the same noise is accepted with probability >= (1 - TV) / (1 + TV)
    (Daliri, Musco & Suresh 2025).
    """

    name = "invariant"

    def pick(self, d: Dist, pos: int) -> int:
        if isinstance(d, OneHot):
            return d.token
        ids, scores = gumbel_scores(d, self.seed, pos)
        return int(ids[np.argmax(scores)])

    def verify(self, p_at: PAt, q: Sequence[Dist], draft: Sequence[int], pos: int) -> tuple[list[int], int]:
        for i, x in enumerate(draft):
            y = self.pick(p_at(i), pos + i)
            if y != x:
                return [*draft[:i], y], i
        return [*draft, self.pick(p_at(len(draft)), pos + len(draft))], len(draft)


class RejectionSampling(Sampling):
    """Speculative rejection sampling (Leviathan et al. 2022, Algorithm 1) on a sequential stream.

    Accepts a model draft with probability 1 - TV, but which random numbers decide a token depends on
    the rounds' drafts: the same seed gives the same distribution, not the same text.
    """

    name = "rejection"

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.rng = np.random.default_rng(seed)

    def pick(self, d: Dist, pos: int) -> int:
        return sample(d, self.rng)

    def verify(self, p_at: PAt, q: Sequence[Dist], draft: Sequence[int], pos: int) -> tuple[list[int], int]:
        for i, x in enumerate(draft):
            p = p_at(i)
            if self.rng.random() * q[i][x] < p[x]:  # accept with probability min(1, p(x) / q(x))
                continue
            if isinstance(p, OneHot):  # a rejection leaves all of a one-hot p's residual mass on its token
                return [*draft[:i], p.token], i
            n = p.size if isinstance(p, np.ndarray) else p.n_vocab
            residual = np.maximum(dense(p, n) - dense(q[i], n), 0.0)
            return [*draft[:i], sample(residual if residual.sum() > 0 else dense(p, n), self.rng)], i
        return [*draft, sample(p_at(len(draft)), self.rng)], len(draft)


SAMPLINGS: dict[str, type[Sampling]] = {s.name: s for s in (InvariantSampling, RejectionSampling)}
