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
from collections.abc import Callable, Iterator, Sequence
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

    @property
    def ids(self) -> np.ndarray:
        return np.array([self.token], dtype=np.int64)

    @property
    def p(self) -> np.ndarray:
        return np.ones(1)


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


_STRIDE = 32  # a strided sample of the logits bounds their m largest cheaply: its m-th largest has m above it
# How far a float32 estimate of a full-vocabulary mass may be from the float64 sum (relative; a rounded difference
# from the largest logit costs 6e-8 per unit of it, float32's exp and sum about 1e-6): the bound is four times that.
_MASS_ERROR = 2e-5


def _ranked(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ids (ascending) by descending logit, ties by ascending id: the order top-k and top-p cut in."""
    return ids[np.argsort(-logits[ids], kind="stable")]


def _finite(logits: np.ndarray) -> np.ndarray:
    """Ids (ascending) of the finite logits (a grammar's mask leaves the rest at -inf)."""
    return np.isfinite(logits).nonzero()[0]


def _at_least(logits: np.ndarray, x: float) -> np.ndarray:
    """Ids (ascending) of the logits >= x, as compared in float64 (x rounded up to the logits' own type)."""
    t = logits.dtype.type(x)
    if float(t) < x:
        t = np.nextafter(t, logits.dtype.type(np.inf))
    return np.flatnonzero(logits >= t)


def _top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids ascending, their logits) of the k largest finite logits, a tie at the k-th going to the lower ids (all
    finite ones where fewer)."""
    cand = _top(logits, k)
    values = logits[cand]
    if cand.size <= k:
        return cand, values
    kth = values[np.argpartition(values, cand.size - k)[cand.size - k]]
    keep = values >= kth
    if (n := np.count_nonzero(keep)) > k:  # a tie at the k-th: its lower ids
        tied = (values == kth).nonzero()[0]
        keep[tied[k - (n - tied.size) :]] = False
    return cand[keep], values[keep]


def _top(logits: np.ndarray, m: int) -> np.ndarray:
    """Ids (ascending) of every logit at least the m-th largest finite one's (all finite ones where fewer): a
    superset of the m largest, found in one pass by a threshold a strided sample gives."""
    sample = logits[::_STRIDE]
    if sample.size > m:
        v = np.partition(sample, sample.size - m)[sample.size - m]
        if v > -np.inf:
            return (logits >= v).nonzero()[0]
    return _finite(logits)


def _mass(logits: np.ndarray, lmax: float) -> float:
    """sum(exp(l - lmax)) over the finite logits in float64, by ascending id: the mass top-p is relative to."""
    return float(np.exp(logits[_finite(logits)].astype(np.float64) - lmax).sum())


def _mass_bounds(logits: np.ndarray, lmax: float) -> tuple[float, float]:
    """Bounds on `_mass` from one float32 pass (equal bounds: the exact mass, for logits not in float32)."""
    if logits.dtype != np.float32:
        z = _mass(logits, lmax)
        return z, z
    e = logits - np.float32(lmax)
    np.exp(e, out=e)
    z = float(e.sum())
    return z * (1 - _MASS_ERROR), z * (1 + _MASS_ERROR)


def _nucleus(cum: np.ndarray, z_lo: float, z_hi: float, top_p: float) -> int | None:
    """The first index where cum / z >= top_p, for every z in [z_lo, z_hi] (None: it depends on where z is)."""
    i = int(np.searchsorted(cum / z_lo, top_p))
    return i if i == int(np.searchsorted(cum / z_hi, top_p)) else None


def _cumulative(logits: np.ndarray, order: np.ndarray, lmax: float) -> np.ndarray:
    return np.cumsum(np.exp(logits[order].astype(np.float64) - lmax))


def _top_p(logits: np.ndarray, lmax: float, top_p: float, cand: np.ndarray | None) -> np.ndarray:
    """The nucleus over the whole vocabulary (top-k off), relative to its whole mass: the shortest prefix of
    `cand` (ascending ids; None: every finite logit) by descending logit with mass >= top_p.

    The whole mass is bounded from float32 and taken exactly only where the bound leaves the cut in doubt; the
    prefix is sorted only as far as the cut (the m largest, m growing), never the whole vocabulary unless needed.
    """
    z_lo, z_hi = _mass_bounds(logits, lmax)
    for part, whole in _prefixes(logits, cand):
        order = _ranked(logits, part)
        cum = _cumulative(logits, order, lmax)
        cut = _nucleus(cum, z_lo, z_hi, top_p)
        if cut is None:  # the float32 bound leaves the cut in doubt: the exact mass decides
            z_lo = z_hi = _mass(logits, lmax)
            cut = _nucleus(cum, z_lo, z_hi, top_p)
        assert cut is not None
        if cut < order.size or whole:
            return order[: cut + 1]
    raise AssertionError("the last prefix is whole")


def _prefixes(logits: np.ndarray, cand: np.ndarray | None) -> Iterator[tuple[np.ndarray, bool]]:
    """Ever longer sets of the largest of `cand` (None: every finite logit), each with whether it is all of it."""
    if cand is None:
        for m in (256, 4096, 65536):
            yield _top(logits, m), False
        cand = _finite(logits)
    yield cand, True


SMALL = 64  # tokens: a set this small goes through the chain in Python floats (numpy's calls cost more on it)


def _small_chain(ids: list[int], logits: list[float], s: SamplerSettings) -> Probs:
    """The chain after top-k on a small top-k set (`ids` ascending, their logits): the same steps in floats."""
    lmax = max(logits)
    w = [math.exp(x - lmax) for x in logits]
    z = sum(w)
    kept: Sequence[int] = range(len(ids))
    if s.min_p > 0:
        floor = lmax + math.log(s.min_p)
        kept = [i for i in kept if logits[i] >= floor]
    if s.top_p < 1.0:
        cum, order = 0.0, sorted(kept, key=lambda i: -logits[i])  # by descending logit, ties by ascending id
        for n, i in enumerate(order, 1):
            cum += w[i]
            if cum / z >= s.top_p:
                kept = sorted(order[:n])
                break
    e = [math.exp((logits[i] - lmax) / s.temperature) for i in kept]
    total = sum(e)
    return Probs(np.array([ids[i] for i in kept], dtype=np.int64), np.array([x / total for x in e]))


def process(logits: np.ndarray, s: SamplerSettings) -> Probs | OneHot:
    """Raw logits -> the sampling distribution after the sampler chain (its support by ascending id, summing to 1).

    Greedy (temperature 0) gives a OneHot at the argmax. Top-k and top-p cut in the order of descending logit, a
    tie going to the lower id. No step looks at more of the vocabulary than it needs: top-k takes its candidates
    above a threshold one pass finds, min-p is a threshold, and top-p sorts only as far as its cut.
    """
    if s.greedy:
        return OneHot(int(logits.argmax()))
    if s.top_k > 0:  # the top-k set is small: every step on it, the mass top-p is relative to its
        cand, values = _top_k(logits, s.top_k)
        if cand.size <= SMALL:
            return _small_chain(cand.tolist(), values.tolist(), s)
        lc = values.astype(np.float64)
        lmax = float(lc.max())
        w = np.exp(lc - lmax)
        z = float(w.sum())
        if s.min_p > 0:  # p_i / p_max >= min_p: a prefix of the ranked order, like top-p
            keep = lc >= lmax + math.log(s.min_p)
            cand, lc, w = cand[keep], lc[keep], w[keep]
        if s.top_p < 1.0:
            order = np.argsort(-lc, kind="stable")  # by descending logit, ties by ascending id
            cut = int(np.searchsorted(np.cumsum(w[order]) / z, s.top_p)) + 1
            if cut < order.size:
                keep = np.sort(order[:cut])
                cand, lc = cand[keep], lc[keep]
        w = np.exp((lc - lmax) / s.temperature)
        return Probs(cand.astype(np.int64, copy=False), w / w.sum())
    lmax = float(logits.max())  # top-k off: top-p is relative to the whole vocabulary
    kept = _at_least(logits, lmax + math.log(s.min_p)) if s.min_p > 0 else None
    if s.top_p < 1.0:
        support = np.sort(_top_p(logits, lmax, s.top_p, kept))
    else:
        support = kept if kept is not None else _finite(logits)
    w = np.exp((logits[support].astype(np.float64) - lmax) / s.temperature)
    return Probs(support.astype(np.int64, copy=False), w / w.sum())


# ---- keyed Gumbel noise ------------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))
_MASK = (1 << 64) - 1


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, vectorized (uint64 arithmetic wraps)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def _mix_int(z: int) -> int:
    """`_mix` of one 64-bit value, in Python integers (a scalar position's key: no numpy call)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def gumbel(seed: int, pos: int | np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Standard Gumbel noise for token `ids` at context position `pos`: a pure function of its key.

    A counter-based hash (splitmix64 of seed, position and id), so the noise of any token at any
    position is computed on its own, in any order, and only for the tokens that need it. An array of
    positions gives one row per position.
    """
    if np.ndim(pos) == 0:  # one position (every pick): its key in Python integers
        z = _mix(np.asarray(ids, dtype=np.uint64) * _GOLDEN + np.uint64(_key(seed, int(pos))))
    else:
        with np.errstate(over="ignore"):
            keys = np.uint64(_start(seed)) + np.asarray(pos, dtype=np.uint64)[..., None] * np.uint64(0xD1B54A32D192ED03)
            z = _mix(np.asarray(ids, dtype=np.uint64) * _GOLDEN + _mix(keys))
    u = ((z >> _S11).astype(np.float64) + 0.5) * 2.0**-53  # uniform in (0, 1)
    g = -np.log(-np.log(u))
    return g


def _start(seed: int) -> int:
    return (int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK


def _key(seed: int, pos: int) -> int:
    """The noise's key at one position."""
    return _mix_int((_start(seed) + int(pos) * 0xD1B54A32D192ED03) & _MASK)


def _gumbel_one(key: int, token: int) -> float:
    """`gumbel` of one token, in Python numbers (the same hash, uniform and transform)."""
    u = ((_mix_int((token * 0x9E3779B97F4A7C15 + key) & _MASK) >> 11) + 0.5) * 2.0**-53
    return -math.log(-math.log(u))


def _log(p: float) -> float:
    """log p, and -inf at 0 (a probability a low temperature took under the smallest float), as numpy's log."""
    return math.log(p) if p > 0 else -math.inf


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
        if isinstance(d, Probs) and d.ids.size <= SMALL:  # in Python numbers: the same scores, fewer calls
            key, ids, p = _key(self.seed, pos), d.ids.tolist(), d.p.tolist()
            return ids[max(range(len(ids)), key=lambda i: _log(p[i]) + _gumbel_one(key, ids[i]))]
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


_SURE_HEAD = 6.0  # logits within this of the top are summed exactly in top_probability; the rest are sampled


def top_probability(logits: np.ndarray) -> float:
    """The model's probability of its likeliest token at temperature 1 (after any grammar mask): how sure it is.

    An estimate for the planner: the softmax's mass near the top summed exactly, the rest (each token under
    e^-6 of the top's) from a strided sample, so no pass exponentiates the whole vocabulary."""
    top = float(logits.max())
    cut = top - _SURE_HEAD
    head = logits[logits >= cut]
    sample = logits[::_STRIDE]
    tail = sample[sample < cut]
    return 1.0 / (float(np.exp(head - top).sum()) + _STRIDE * float(np.exp(tail - top).sum()))


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
