"""Pure-numpy sampling: the sampler chain, and the two ways of choosing and verifying tokens.

Nothing here touches llama.cpp, so every rule can be tested exhaustively on small vocabularies.
The chain follows llama.cpp's default order: top-k, top-p, min-p (all on the temperature-1
softmax), then temperature on the survivors. Temperature 0 is greedy: one-hot at the argmax.

Tokens are chosen by drafter-invariant sampling (`InvariantSampling`): the token at each position is
argmax(log p + g), with Gumbel noise g keyed by (seed, position, token id), an exact sample of p. It
is a function of the seed, the position and the target's distribution only, so the same seed gives
the same text whatever was drafted. A draft token is accepted iff it is that token; a draft model
drafts argmax(log q + g) with the same g.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from localspec.settings import checked, default


@dataclass(frozen=True)
class SamplerSettings:
    """Sampler parameters, applied identically to target (p) and draft (q) logits."""

    temperature: float = default("temperature")
    top_k: int = default("top_k")
    top_p: float = default("top_p")
    min_p: float = default("min_p")

    def __post_init__(self) -> None:
        """Every value within the settings table's range (ValueError naming it): checked here, once, whoever
        builds the settings (a CLI flag, a chat's /set, a server field, an API call)."""
        for f in fields(self):
            object.__setattr__(self, f.name, checked(f.name, getattr(self, f.name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class OneHot:
    """A one-hot distribution at `token` (a copied draft, or greedy sampling)."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.ids = np.array([token], dtype=np.int64)
        self.p = np.ones(1)


class Probs:
    """A distribution over the vocabulary kept as its support: token ids and their probabilities.

    The chain leaves a few dozen tokens; keeping only those (no vocabulary-sized array per position)
    keeps a wide verify cheap.
    """

    def __init__(self, ids: np.ndarray, p: np.ndarray) -> None:
        self.ids, self.p = ids, p


Dist = Probs | OneHot | np.ndarray  # a sampling distribution over the vocabulary (dense arrays: tests)


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
    return Probs(cand.astype(np.int64), w / w.sum())


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


class InvariantSampling:
    """Gumbel-max with noise keyed by (seed, position, token id): the text depends on nothing else.

    A copied token x is accepted with probability p(x), as under rejection sampling (Leviathan et al.
    2022); a model draft drawn with the same noise is accepted with probability >= (1 - TV) / (1 + TV)
    (Daliri, Musco & Suresh 2025), against rejection sampling's 1 - TV.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def pick(self, d: Dist, pos: int) -> int:
        """The token drawn from d for context position pos."""
        if isinstance(d, OneHot):
            return d.token
        ids, scores = gumbel_scores(d, self.seed, pos)
        return int(ids[np.argmax(scores)])

    def verify(self, p_at: PAt, draft: Sequence[int], pos: int) -> tuple[list[int], int]:
        """(emitted tokens, accepted draft tokens) for a draft at context positions pos, pos + 1, ...

        The emitted tokens are the accepted prefix plus the target's own token at the first miss (or a
        bonus token): at every position, the token the target alone would emit there.
        """
        for i, x in enumerate(draft):
            y = self.pick(p_at(i), pos + i)
            if y != x:
                return [*draft[:i], y], i
        return [*draft, self.pick(p_at(len(draft)), pos + len(draft))], len(draft)


# ---- log-probabilities -------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability and the n most likely tokens at its position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token, log-probability), most likely first


def top_probability(logits: np.ndarray) -> float:
    """The model's probability of its likeliest token at temperature 1 (after any grammar mask): how sure it is."""
    top = logits.max()
    return 1.0 / float(np.exp(logits - top).sum())


def token_logprob(logits: np.ndarray | None, token: int, n: int) -> TokenLogprob:
    """Log-softmax of the target's logits at one position (at temperature 1, after any grammar mask):
    the model's own distribution, as OpenAI reports it, whatever sampler settings chose the token.
    None: a position where the grammar allowed this token alone (probability 1)."""
    if logits is None:
        return TokenLogprob(token, 0.0, ((token, 0.0),) if n else ())
    x = logits.astype(np.float64)
    lse = float(x.max()) + math.log(float(np.exp(x - x.max()).sum()))
    top = np.argpartition(-x, n)[:n] if 0 < n < x.size else np.arange(x.size if n else 0)
    top = top[np.argsort(-x[top], kind="stable")]
    top = top[np.isfinite(x[top])]  # a grammar may allow fewer than n
    return TokenLogprob(token, float(x[token]) - lse, tuple((int(t), float(x[t]) - lse) for t in top))
