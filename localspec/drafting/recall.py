"""Drafting from earlier answers: a regenerated answer, an agent's repeated tool call, a fix asked for again.

The store keeps recent answers, each after the last prompt tokens it answered (what tells one answer's start
from another's), in one bounded array of tokens, oldest out first, kept in a file across restarts. An index of
its token pairs finds where the context's last tokens occurred before; the longest such match (the most recent
among equals), at least MIN_MATCH tokens, is followed while the output goes on repeating it. How long those
copies hold is learned as the copier learns it; proposals are one-hot: sampling stays exact.
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from filelock import Timeout

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer, Verdict
from localspec.drafting.copier import BreakStats
from localspec.drafting.costs import CostModel
from localspec.files import atomic_path, locked, set_aside, sweep

MAX_TOKENS = 262_144  # the store's bound (1 MiB on disk)
PROMPT_TAIL = 32  # prompt tokens kept before each answer
MIN_MATCH = 8  # context tokens that must match before the store is followed
MAX_MATCH = 64  # a match is measured this far back at most
_GAP = -1  # between entries
HEADER = 4096  # the most a store file's .npy header takes


class AnswerStore:
    """Recent answers after their prompts' last tokens, as one array with an index of its token pairs; kept in
    `path` (None: this process only), every token checked against `vocab` (the target's vocabulary size) as read.

    Processes share the file: each adds its answer under the file's lock to what the file holds then (another
    process's answers included; none where `localspec cache clear` removed it). A file that is not a whole store
    (cut short, damaged, not a regular file, a token beyond the vocabulary) is set aside with one line."""

    def __init__(self, path: Path | None = None, limit: int = MAX_TOKENS, vocab: int | None = None) -> None:
        self.path, self.limit, self.vocab = path, limit, vocab
        self._seen: tuple[int, int] | None = None  # the file's (mtime, size) as this process last read or wrote it
        self.tokens = np.empty(0, np.int32)
        if path is not None:
            sweep(path.parent)
            self.tokens = self._read()
        self._index()

    def _read(self) -> np.ndarray:
        """The file's tokens (none where it is missing or cannot be read now; set aside where it is no store)."""
        assert self.path is not None
        empty = np.empty(0, np.int32)
        try:
            st = self.path.stat()
            if not stat.S_ISREG(st.st_mode) or st.st_size > 4 * self.limit + HEADER:
                raise ValueError("not a store")
            loaded = np.load(self.path, mmap_mode="r", allow_pickle=False)  # a shape beyond the file is refused
            tokens = np.array(loaded[-self.limit :], np.int32) if loaded.ndim == 1 else None
            if tokens is None or loaded.dtype != np.int32 or not _valid(tokens, self.vocab):
                raise ValueError("not a store")
        except FileNotFoundError:
            self._seen = None
            return empty
        except PermissionError:  # there, not readable now: left as it is
            return empty
        except Exception:  # cut short, damaged, crafted: whatever numpy raises of it
            set_aside(self.path)
            self._seen = None
            return empty
        self._seen = (st.st_mtime_ns, st.st_size)
        return tokens

    def _stamp(self) -> tuple[int, int] | None:
        """The file's (mtime, size) now (None: not there, or not to be read)."""
        assert self.path is not None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _index(self) -> None:
        pairs = _pairs(self.tokens)
        self._order = np.argsort(pairs)  # equal pairs in any order: a match is chosen by its length, then its end
        self._pairs = pairs[self._order]

    def add(self, prompt_tail: Sequence[int], answer: Sequence[int]) -> None:
        """Keep an answer after its prompt's last tokens (the oldest entries out beyond the bound), saved under the
        file's lock onto what the file holds now."""
        if not answer:
            return
        entry = np.asarray([*prompt_tail, *answer, _GAP], np.int32)
        if self.path is None:
            self._append(entry)
            return
        added = False
        try:
            with locked(self.path):
                if self._stamp() != self._seen:  # changed by another process, or cleared: the file's answers are ours
                    self.tokens = self._read()
                    self._index()
                self._append(entry)
                added = True
                with atomic_path(self.path) as part, open(part, "wb") as f:
                    np.save(f, self.tokens, allow_pickle=False)
                self._seen = self._stamp()
        except (OSError, Timeout):  # not saved (a full disk, a lock held too long): kept in this process
            if not added:
                self._append(entry)

    def _append(self, entry: np.ndarray) -> None:
        """The entry in, the oldest entries out beyond the bound; the index takes the new pairs in and the old ones
        out, with no sort of the whole."""
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


def _valid(tokens: np.ndarray, vocab: int | None) -> bool:
    """Every token a vocabulary's (or the gap between entries)."""
    return not tokens.size or (int(tokens.min()) >= _GAP and (vocab is None or int(tokens.max()) < vocab))


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
