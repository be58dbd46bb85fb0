"""Prompt-lookup (n-gram) drafting that follows where the output is copying from.

The drafter keeps a planned continuation: the tokens after a pointer into the context (prompt and
output so far) that the output is copying. While the copy holds it proposes from that plan; after
an edit (the target wrote something else) it resynchronizes on the longest match of the last
tokens, preferring matches just after the point where the copy broke. When it resynchronizes there
it learns the edit (these source tokens became those output tokens, a rename say) and applies it
to later occurrences, so copies run straight through repeated edits. It learns, too, whether the
output joins the source's hard-wrapped lines ('wrapped\n' 'line' becomes 'wrapped line', as a
summary quoting a wrapped document does) and copies across line breaks the way the output writes
them. It also tracks how long copies hold (a break rate by run length) for the planner.
Proposals are one-hot: sampling stays exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer, Verdict, register
from localspec.drafting.costs import CostModel

if TYPE_CHECKING:
    from localspec.llama.model import Model

_RUN_BUCKETS = (1, 2, 4, 8, 16, 32)  # upper bounds of the run-length buckets of the break rate
_MAX_EDIT = 16  # longest edit (either side) it learns
# The most learned edits kept, the least recently used dropped first: a server's copier lives as long as it does,
# and a file's renames are a handful.
MAX_EDITS = 512
# The answer repeating its own text is drafted only once the match is this long: in prose, shorter echoes
# ("can lead to", a list number) break at once (docs/benchmarks.md, "The planner's and the copier's constants").
_MIN_ECHO = 6
# Prior counts of copied tokens by run length, against one break in each bucket: a copy that has held
# for long tends to go on. Row 0: copies from the input (the prompt, earlier turns), which the output
# quotes and edits; row 1: the output repeating itself, where short matches are mostly incidental
# (a phrase that recurs, a list number) and break twice as often. Tuned by replaying greedy answers.
# Row 2: under a grammar, a copy that resumed near where the last one broke: the next field of a record
# the output quotes from the input, whose first tokens hold as well as the rest.
_PRIOR_COPIED = np.array(
    [[0.5, 1, 3, 10, 30, 100, 300], [0.25, 0.5, 1.5, 5, 15, 100, 300], [2, 3, 5, 10, 30, 100, 300]]
)


def _bucket(run: int) -> int:
    return next((i for i, b in enumerate(_RUN_BUCKETS) if run <= b), len(_RUN_BUCKETS))


class BreakStats:
    """How long copies hold: decayed counts of copied tokens and of breaks, by source side and run length.

    Side 0 is a copy from the input (the prompt, earlier turns), side 1 the output repeating itself, side 2
    (under a grammar) a copy that resumed near where the last one broke.
    """

    def __init__(self, decay: float = 0.97) -> None:
        self.decay = decay
        self.copied = _PRIOR_COPIED.copy()
        self.breaks = np.ones_like(self.copied)

    def holds(self, side: int, run: int, n: int) -> list[float]:
        """S_j, j = 1..n: the probability that the next j tokens of a copy that has held for `run` all hold."""
        rate = self.breaks[side] / (self.copied[side] + self.breaks[side])
        s, out = 1.0, []
        for j in range(n):
            s *= 1.0 - rate[_bucket(run + j)]
            out.append(s)
        return out

    def new_round(self) -> None:
        """Age the evidence: recent rounds count more."""
        self.copied *= self.decay
        self.breaks *= self.decay

    def held(self, side: int, run: int, n: int = 1) -> None:
        """n more tokens held, the first at run length `run`."""
        for j in range(n):
            self.copied[side, _bucket(run + j)] += 1

    def broke(self, side: int, run: int) -> None:
        self.breaks[side, _bucket(run)] += 1


class Rewrites:
    """What the output does to the source as it copies: learned edits (a rename applies to later
    occurrences), source tokens where copies break for reasons not yet learned, and joined line breaks."""

    def __init__(self, join: LineJoin | None = None) -> None:
        self.join = join
        self.join_lines = False  # whether the output joins the source's wrapped lines (learned)
        self.edits: dict[tuple[int, ...], tuple[int, ...]] = {}  # source tokens -> what the output wrote
        self.broken: set[int] = set()  # source tokens where a copy broke and no edit is known yet

    def learn(self, src: tuple[int, ...], out: tuple[int, ...]) -> None:
        """The output wrote `out` where the source has `src` (kept when short enough to be an edit)."""
        if src and len(src) <= _MAX_EDIT and len(out) <= _MAX_EDIT:
            self.edits.pop(src, None)
            self.edits[src] = out  # the most recently used last
            if len(self.edits) > MAX_EDITS:
                del self.edits[next(iter(self.edits))]
            self.broken.discard(src[0])

    def at(self, ctx: list[int], pos: int, heads: set[int]) -> tuple[int, tuple[int, ...]] | None:
        """(source tokens used, output tokens) of a rewrite starting at ctx[pos], if one applies."""
        if ctx[pos] in heads:
            for src, out in self.edits.items():
                if tuple(ctx[pos : pos + len(src)]) == src:
                    self.edits[src] = self.edits.pop(src)  # used: the last to be dropped
                    return len(src), out
        if self.join_lines and self.join is not None:
            return self.join(ctx[pos : pos + LineJoin.MAX_WORD + 1])
        return None

    def switched_line_joining(self, source: list[int], src_pos: int, emitted: int) -> tuple[list[int], int] | None:
        """At a miss on a source line break: if the output wrote it the other way (joined or not), flip the
        convention (it applies to later line breaks too) and return (the rest of the rewrite, next source index)."""
        if self.join is None or src_pos >= len(source):
            return None
        joined = self.join(source[src_pos : src_pos + LineJoin.MAX_WORD + 1])
        if joined and not self.join_lines and joined[1][0] == emitted:
            result = list(joined[1][1:]), src_pos + joined[0]
        elif joined and self.join_lines and source[src_pos] == emitted:
            result = [], src_pos + 1
        else:
            return None
        self.join_lines = not self.join_lines
        return result


class LineJoin:
    """A line break joined with a space: tokens ('wrapped\n', 'li', 'ne') -> (3, tokens of 'wrapped line').

    Gives (source tokens used, joined tokens), or None unless the first token ends one line (a single
    newline) and a word follows. piece gives a token's bytes, tokenize the tokens of some text (the
    target's own tokenizer: the joined word is tokenized as the output would write it).
    """

    MAX_WORD = 6  # tokens of the word after the line break

    def __init__(self, piece: Callable[[int], bytes], tokenize: Callable[[str], list[int]]) -> None:
        self.piece, self.tokenize = piece, tokenize
        self._pieces: dict[int, bytes] = {}
        self._joined: dict[tuple[int, ...], tuple[int, tuple[int, ...]] | None] = {}

    def _piece(self, token: int) -> bytes:
        if token not in self._pieces:  # a negative id marks a boundary (a prediction's ends): no text
            self._pieces[token] = self.piece(token) if token >= 0 else b""
        return self._pieces[token]

    def __call__(self, tokens: Sequence[int]) -> tuple[int, tuple[int, ...]] | None:
        first = self._piece(tokens[0]) if tokens else b""
        if not first.endswith(b"\n") or first.endswith(b"\n\n"):
            return None
        word = 1
        while word < min(len(tokens), self.MAX_WORD + 1) and self._piece(tokens[word])[:1].isalnum():
            word += 1
        key = tuple(tokens[:word])
        if key not in self._joined:
            head, tail = first[:-1], b"".join(self._piece(t) for t in key[1:])
            self._joined[key] = None
            if word > 1 and not head.endswith(b"\r"):
                with contextlib.suppress(UnicodeDecodeError):  # the break splits a character: no joined form
                    self._joined[key] = (word, tuple(self.tokenize((head + b" " + tail).decode())))
        return self._joined[key]


class Words:
    """Tokens keyed by their text without one leading space: ' Maria' and 'Maria' share a key."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self.piece = piece
        self._keys: dict[int, int] = {}
        self._ids: dict[bytes, int] = {}

    def key(self, token: int) -> int:
        if (k := self._keys.get(token)) is None:
            text = self.piece(token) if token >= 0 else b""
            text = text.removeprefix(b" ") if text else b"\0%d" % token  # no text (a boundary, a control token): itself
            k = self._keys[token] = self._ids.setdefault(text, len(self._ids))
        return k

    def keys(self, tokens: Sequence[int]) -> np.ndarray:
        return np.fromiter(map(self.key, tokens), np.int64, len(tokens))


class Copier(Drafter):
    """Copies continuations from the context: where the copy points, resynchronizing after edits.

    What the output does to the source is kept in `rewrites`, how long copies hold in `stats`.
    """

    name = "copier"

    def __init__(
        self,
        join: LineJoin | None = None,
        max_ngram: int = 8,
        resync_window: int = 48,
        decay: float = 0.97,
        *,
        piece: Callable[[int], bytes] | None = None,
    ) -> None:
        self.max_ngram, self.resync_window = max_ngram, resync_window
        self.words = Words(piece) if piece is not None else None  # a word with or without its leading space
        self._piece = piece
        self.rewrites = Rewrites(join)
        self.stats = BreakStats(decay)
        self.source_end: int | None = None  # where this generation's output starts in the context (None: unknown)
        self.quotes_input = True  # whether the output may quote its input (not so a fill-in-the-middle's)
        self.plan: list[int] = []  # the continuation the copy predicts
        self.plan_src: list[int] = []  # for each planned token, the source index after it
        self.plan_from = 0  # the source index the plan starts at
        self.run = 0  # tokens confirmed in the current copy (starts at the matched n-gram length)
        self.anchor: int | None = None  # source index where the last copy broke ...
        self.broke_at = 0  # ... and the output index of the token that broke it
        self.resumed = False  # whether the copy resumed under a grammar near where the last one broke
        self.forced: set[int] = set()  # context positions a grammar forced: no text the output chose
        self._array = np.empty(256, np.int64)  # the context as an array, converted as it grows ...
        self._known = 0  # ... its first _known tokens

    @property
    def join_lines(self) -> bool:
        """Whether the output joins the source's hard-wrapped lines (learned)."""
        return self.rewrites.join_lines

    @join_lines.setter
    def join_lines(self, value: bool) -> None:
        self.rewrites.join_lines = value

    def begin(self, prompt_len: int, *, fill: bool = False) -> None:
        """A new generation, whose output follows the first prompt_len tokens of the context."""
        self.source_end = prompt_len
        self.quotes_input = not fill  # a middle is new code beside its context: copies of it are coincidences
        self.reset()

    def reset(self) -> None:
        """Forget the copy position (a new context); what was learned about edits and breaks stays."""
        self.plan, self.plan_src, self.plan_from, self.run = [], [], 0, 0
        self.anchor, self.broke_at, self.resumed = None, 0, False
        self.forced.clear()
        self._known = 0

    def _tokens(self, ctx: list[int]) -> np.ndarray:
        """ctx as an array: only what was appended since the last call is converted (a generation's context
        grows at its end; anything else starts it afresh)."""
        n, known = len(ctx), self._known
        if known > n or (known and (ctx[known - 1] != self._array[known - 1] or ctx[0] != self._array[0])):
            known = 0
        if self._array.size < n:
            grown = np.empty(max(n, 2 * self._array.size), np.int64)
            grown[:known] = self._array[:known]
            self._array = grown
        self._array[known:n] = ctx[known:n]
        self._known = n
        return self._array[:n]

    # ---- finding and extending the copy ------------------------------------------------------
    def _resync(self, ctx: list[int]) -> None:
        arr, n = self._tokens(ctx), len(ctx)
        self.plan, self.plan_src, self.run = [], [], 0
        # what a grammar forced says nothing of what the output writes next: never matched, never copied
        chosen = np.ones(n, dtype=bool)
        chosen[[i for i in self.forced if i < n]] = False
        if not chosen[-1]:
            return
        exact = (arr[: n - 1] == arr[-1]) & chosen[: n - 1]
        near = np.zeros(n - 1, dtype=bool)
        if self.anchor is not None:  # after an edit the copy usually resumes just after it
            near[max(self.anchor - 1, 0) : self.anchor + self.resync_window] = True
        # under a grammar (something was forced) a word also matches itself with a leading space: a value it
        # opened quotes a word of the input ('"Maria' quoting ' Maria'), where the copy resumes or nothing
        # matches exactly
        folded = np.zeros(n - 1, dtype=bool)
        if self.words and self.forced:
            folded = (self.words.keys(ctx)[: n - 1] == self.words.key(ctx[-1])) & chosen[: n - 1] & ~exact
            folded &= near if exact.any() else True
        cand = np.flatnonzero(exact | folded)
        if cand.size == 0:
            return
        length = np.ones(cand.size, dtype=np.int64)
        alive = exact[cand]
        for back in range(1, self.max_ngram):
            prev = np.maximum(cand - back, 0)
            alive &= (cand - back >= 0) & (arr[prev] == arr[n - 1 - back]) & chosen[prev] & chosen[n - 1 - back]
            length += alive
        # the longest match (an exact one first), then the most recent; near where the last copy broke first
        near = near[cand]
        score = length - 0.5 * folded[cand] + cand / n + 2.0 * near
        best = int(np.argmax(score))
        pointer, matched = int(cand[best]) + 1, int(length[best])
        if self.anchor is not None and not near[best] and matched < 3:
            return  # a short match elsewhere right after an edit is mostly noise
        self.resumed = bool(near[best]) and bool(self.forced)
        if near[best] and self.anchor is not None:  # what lay between the break and here was an edit
            src_end, out_end = pointer - matched, len(ctx) - matched
            if src_end >= self.anchor and out_end >= self.broke_at:
                self.rewrites.learn(tuple(ctx[self.anchor : src_end]), tuple(ctx[self.broke_at : out_end]))
            self.anchor = None
        self.run = matched
        self._extend(ctx, pointer, 1)

    def _extend(self, ctx: list[int], pos: int, want: int) -> None:
        """Append to the plan from source index pos, applying rewrites, to `want` tokens."""
        heads = {src[0] for src in self.rewrites.edits}
        if not self.plan:
            self.plan_from = pos
        while len(self.plan) < want and pos < len(ctx):
            if rewrite := self.rewrites.at(ctx, pos, heads):
                used, out = rewrite
                pos += used
                self.plan += out
                self.plan_src += [pos] * len(out)
            else:
                if self.plan and (ctx[pos] in self.rewrites.broken or self._control(ctx[pos])):
                    # stop before a source token that was edited in a way not yet learned, or before a control
                    # token: past the end of a message lies the template's text, which no answer writes
                    return
                self.plan.append(ctx[pos])
                pos += 1
                self.plan_src.append(pos)

    def _control(self, token: int) -> bool:
        """A control token (end of turn, a role's header): it writes no text."""
        return self._piece is not None and not self._piece(token)

    def propose(self, ctx: list[int], k_max: int) -> list[int]:
        """Up to k_max tokens the output is expected to copy next."""
        if not self.plan:
            self._resync(ctx)
        if self.plan and len(self.plan) < k_max:
            self._extend(ctx, self.plan_src[-1], k_max)
        return self.plan[:k_max]

    # ---- the drafter protocol ----------------------------------------------------------------
    @property
    def _side(self) -> int:
        """Which statistics the current copy uses: 0 for one from the input, 1 for the output's own text (or
        for any copy in a fill-in-the-middle, whose likeness to its context is as incidental), 2 for one
        resumed under a grammar near where the last copy broke."""
        if self.resumed:
            return 2
        return int(not self.quotes_input or (self.source_end is not None and self.plan_from >= self.source_end))

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        return Offer(self.holds(len(self.propose(ctx, k_max))))

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        return list(self.propose(ctx, k))

    def accept(self, ctx: list[int], verdict: Verdict) -> None:
        by, accepted = verdict.by, verdict.accepted
        if by is None or by is self:
            self.learn(ctx, accepted if by is self else 0)
        else:  # another drafter's tokens moved the output: resynchronize, near where the last copy broke
            if by.certain:
                self.forced.update(range(len(ctx) - accepted - 1, len(ctx) - 1))
            self.plan, self.plan_src, self.run = [], [], 0
            self.learn(ctx, 0)

    def holds(self, n: int) -> list[float]:
        """S_j, j = 1..n: the estimated probability that the first j proposed tokens all hold."""
        if self._side == 1 and self.run < _MIN_ECHO:
            return []  # a short echo of the answer's own text is mostly a coincidence: not worth a verify
        return self.stats.holds(self._side, self.run, n)

    # ---- learning from the target ------------------------------------------------------------
    def learn(self, ctx: list[int], accepted: int) -> None:
        """Learn from a round; ctx already ends with the tokens it emitted (accepted + 1)."""
        if not self.plan:
            if self.anchor is not None and len(ctx) - self.broke_at > self.resync_window:
                self.anchor = None  # the copy never resumed near the edit
            return
        self.stats.new_round()
        self.stats.held(self._side, self.run, accepted)
        emitted = ctx[-1]
        if accepted < len(self.plan) and self.plan[accepted] == emitted:  # the target's own token copied too
            self.stats.held(self._side, self.run + accepted)
            self.plan_from = self.plan_src[accepted]
            del self.plan[: accepted + 1], self.plan_src[: accepted + 1]
            self.run += accepted + 1
            return
        src_pos = self.plan_src[accepted - 1] if accepted else self.plan_from
        # the plan ran out (end of context or an unlearned edit), and the output goes on copying
        if accepted == len(self.plan) and src_pos < len(ctx) - 1 and ctx[src_pos] == emitted:
            self.rewrites.broken.discard(emitted)  # not edited this time
            self.plan, self.plan_src = [], []
            self._extend(ctx, src_pos + 1, 1)
            self.run += accepted + 1
            return
        source = ctx[: len(ctx) - accepted - 1]  # what came before this round's tokens
        if switched := self.rewrites.switched_line_joining(source, src_pos, emitted):
            rest, nxt = switched
            self.stats.held(self._side, self.run + accepted)
            self.plan, self.plan_src, self.plan_from = rest, [nxt] * len(rest), src_pos
            self._extend(ctx, nxt, len(rest) + 1)
            self.run += accepted + 1
            return
        self.stats.broke(self._side, self.run + accepted)
        if src_pos < len(ctx) - accepted - 1:
            self.rewrites.broken.add(ctx[src_pos])
            self.anchor, self.broke_at = src_pos, len(ctx) - 1
        self.plan, self.plan_src = [], []  # resynchronize next round


def _for(target: Model) -> Copier:
    """The copier of a target: its line joins and control tokens read from the target's vocabulary."""
    return Copier(LineJoin(target.piece, target.tokenize), piece=target.piece)


register(Copier.name, _for)  # built in, through the hook a user's drafter takes
