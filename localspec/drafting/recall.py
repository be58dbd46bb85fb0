"""Drafting from earlier answers: a regenerated answer, an agent's repeated tool call, a fix asked for again.

The store keeps recent answers, each after the last prompt tokens it answered (what tells one answer's start
from another's), in one bounded array of tokens, oldest out first, kept in a file across restarts. An index of
its token pairs finds where the context's last tokens occurred before; the longest such match (the most recent
among equals), at least MIN_MATCH tokens, is followed while the output goes on repeating it. How long those
copies hold is learned as the copier learns it; proposals are one-hot: sampling stays exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer, Verdict
from localspec.drafting.copier import BreakStats
from localspec.drafting.costs import CostModel
from localspec.files import atomic_path

MAX_TOKENS = 262_144  # the store's bound (1 MiB on disk)
PROMPT_TAIL = 32  # prompt tokens kept before each answer
MIN_MATCH = 8  # context tokens that must match before the store is followed
MAX_MATCH = 64  # a match is measured this far back at most
_GAP = -1  # between entries


class AnswerStore:
    """Recent answers after their prompts' last tokens, as one array with an index of its token pairs; kept in
    `path` (None: this process only)."""

    def __init__(self, path: Path | None = None, limit: int = MAX_TOKENS) -> None:
        self.path, self.limit = path, limit
        self.tokens = np.empty(0, np.int32)
        if path is not None:
            with contextlib.suppress(OSError, ValueError):  # missing or damaged: start empty
                loaded = np.load(path, allow_pickle=False)
                if loaded.ndim == 1 and loaded.dtype == np.int32:
                    self.tokens = loaded[-limit:]
        self._index()

    def _index(self) -> None:
        pairs = _pairs(self.tokens)
        self._order = np.argsort(pairs)  # equal pairs in any order: a match is chosen by its length, then its end
        self._pairs = pairs[self._order]

    def add(self, prompt_tail: Sequence[int], answer: Sequence[int]) -> None:
        """Keep an answer after its prompt's last tokens (the oldest entries out beyond the bound); saved. The index
        takes the new pairs in and the old ones out, with no sort of the whole."""
        if not answer:
            return
        entry = np.asarray([*prompt_tail, *answer, _GAP], np.int32)
        old, tokens = len(self.tokens), np.concatenate([self.tokens, entry])
        cut = 0
        if (excess := len(tokens) - self.limit) > 0:  # whole entries out from the front
            gaps = np.flatnonzero(tokens[:-1] == _GAP)
            later = gaps[gaps + 1 >= excess]
            cut = int(later[0]) + 1 if later.size else excess
        first = max(old - 1, 0)  # the first new pair: the old last token's and the entry's first
        new = _pairs(tokens[first:])
        sort = np.argsort(new)
        at = np.searchsorted(self._pairs, new[sort])
        pairs, order = np.insert(self._pairs, at, new[sort]), np.insert(self._order, at, sort + first)
        if cut:
            keep = order >= cut
            pairs, order = pairs[keep], order[keep] - cut
        self.tokens, self._pairs, self._order = tokens[cut:], pairs, order
        if self.path is not None:
            with contextlib.suppress(OSError), atomic_path(self.path) as part, open(part, "wb") as f:
                np.save(f, self.tokens, allow_pickle=False)

    def match(self, ctx: Sequence[int]) -> tuple[int, int]:
        """(where the store goes on after ctx's end, how many tokens matched) for the longest match, the latest
        among equals; (0, 0) where none matches."""
        if len(ctx) < 2 or not self._pairs.size:
            return 0, 0
        key = (ctx[-2] << 32) | (ctx[-1] & 0xFFFFFFFF)
        lo, hi = np.searchsorted(self._pairs, [key, key + 1])
        if lo == hi:
            return 0, 0
        ends = self._order[lo:hi] + 2  # where the store goes on after each match
        tail = np.asarray(ctx[-MAX_MATCH:], np.int32)[::-1]
        length = np.full(ends.size, 2)
        alive = np.ones(ends.size, bool)
        for back in range(2, len(tail)):
            at = ends - 1 - back
            alive &= (at >= 0) & (self.tokens[np.maximum(at, 0)] == tail[back])
            if not alive.any():
                break
            length += alive
        best = int(np.lexsort((ends, length))[-1])  # the longest, then the latest
        return int(ends[best]), int(length[best])


def _pairs(tokens: np.ndarray) -> np.ndarray:
    """Each pair of neighbouring tokens as one int64, the pair at i ending at i + 1."""
    t = tokens.astype(np.int64)
    return (t[:-1] << 32) | (t[1:] & 0xFFFFFFFF)


class Recall(Drafter):
    """Follows an earlier answer the output repeats (see the module docstring)."""

    name = "recall"

    def __init__(self, store: AnswerStore) -> None:
        self.store = store
        self.stats = BreakStats()
        self.at = 0  # where in the store the output is followed (0: nowhere)
        self.run = 0  # tokens the current match has held (its matched length first)
        self._prompt_len = 0

    def begin(self, prompt_len: int, *, fill: bool = False) -> None:
        self._prompt_len, self.at, self.run = prompt_len, 0, 0

    def reset(self) -> None:
        self.at, self.run = 0, 0

    def _plan(self, ctx: list[int], k_max: int) -> np.ndarray:
        if not self.at:
            self.at, self.run = self.store.match(ctx)
            if self.run < MIN_MATCH:
                self.at, self.run = 0, 0
        if not self.at:
            return self.store.tokens[:0]
        plan = self.store.tokens[self.at : self.at + k_max]
        gap = np.flatnonzero(plan == _GAP)
        return plan[: gap[0]] if gap.size else plan

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        plan = self._plan(ctx, k_max)
        return Offer(self.stats.holds(0, self.run, len(plan)) if plan.size else ())

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        return [int(t) for t in self._plan(ctx, k)[:k]]

    def accept(self, ctx: list[int], verdict: Verdict) -> None:
        if not self.at:
            return
        n, accepted = verdict.accepted + 1, verdict.accepted  # the round's tokens end ctx
        follows = self.store.tokens[self.at : self.at + n]
        same = np.append(follows == np.asarray(ctx[-n:], np.int32)[: len(follows)], False)
        went_on = int(np.argmin(same)) == n  # the output went on repeating the store (never past a gap)
        if verdict.by is self:
            self.stats.new_round()
            self.stats.held(0, self.run, accepted)
            if went_on:
                self.stats.held(0, self.run + accepted)
            else:
                self.stats.broke(0, self.run + accepted)
        self.at, self.run = (self.at + n, self.run + n) if went_on else (0, 0)

    def end(self, ctx: Sequence[int]) -> None:
        start = self._prompt_len
        self.store.add(ctx[max(0, start - PROMPT_TAIL) : start], ctx[start:])
        self.at, self.run = 0, 0
