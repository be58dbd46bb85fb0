"""The speculative decoding loop: draft k tokens, verify them in one target batch, trim the caches."""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.core.grammar import Constraint
from localspec.core.sampling import (
    Dist,
    InvariantSampling,
    OneHot,
    SamplerSettings,
    TokenLogprob,
    process,
    token_logprob,
)
from localspec.core.stats import Piece, Stats
from localspec.core.text import TextStream
from localspec.decoding.planner import NONE, Plan, Planner
from localspec.drafting.base import Drafter
from localspec.drafting.calibration import DraftChoice
from localspec.drafting.costs import CostModel
from localspec.errors import LocalspecError
from localspec.llama.model import ContextFull, Model


@dataclass
class Round:
    """What one round emitted: its tokens (the accepted draft first), and how it got them."""

    tokens: list[int]
    accepted: int
    drafter: Drafter | None
    drafted: int
    logprobs: list[TokenLogprob]  # one per token when asked for


class Engine:
    """Speculative sampling of `target` with any drafters (the planner picks one, or none, each round).

    k is the draft length, or None for the cost-aware choice of each round (needs `cost`). Tokens are
    chosen by drafter-invariant sampling with `seed`: the same seed gives the same text whatever was drafted.
    """

    def __init__(
        self,
        target: Model,
        drafters: Sequence[Drafter],
        sampler: SamplerSettings,
        k: int | None,
        seed: int,
        *,
        cost: CostModel | None = None,
    ) -> None:
        self.target, self.sampler, self.cost = target, sampler, cost
        self.drafters = list(drafters)
        self.planner = Planner(self.drafters, k=k, cost=cost)
        self.sampling = InvariantSampling(seed)
        self._sampler, self._sampling = sampler, self.sampling  # this generation's (the defaults above, or its own)
        self.notes: list[str] = []  # one-line remarks for the user (a draft model left out, say)
        self.draft_choice: DraftChoice | None = None  # what loading chose about a draft model (settled on save)
        self.busy_seconds = 0.0  # spent generating (prefill and decode), all generations
        self._pending = np.empty((0, target.n_vocab), np.float32)  # target logits already computed
        self._grammar: Constraint | None = None  # this generation's
        self._top_logprobs: int | None = None  # this generation's: log-probabilities with so many alternatives

    @property
    def k(self) -> int | None:
        return self.planner.k

    @k.setter
    def k(self, value: int | None) -> None:
        self.planner.k = value

    def _step(self, ctx: list[int], room: int) -> Round:
        """One round on ctx. The target cache holds ctx[:-1], or all of ctx when the prefill left the next
        logits pending; the grammar, if any, has consumed ctx's output."""
        # Right after the prefill the next token's logits are at hand: emit it before any draft is verified
        # (the first token comes as soon as the target alone's would; drafting starts from the next round).
        plan = NONE if len(self._pending) else self.planner.plan(ctx, room)
        sampler, sampling = self._sampler, self._sampling
        draft = plan.drafter.draft(ctx, plan.k, sampler, sampling) if plan.drafter else []
        grammar = self._grammar
        if grammar is not None and draft:  # a draft goes only as far as the grammar allows it
            draft = draft[: grammar.valid_prefix(draft)]
        # the draft tokens the grammar allows alone: no logits are needed to choose them
        decided = grammar.decided(draft) if grammar is not None else [False] * len(draft)
        pending, self._pending = self._pending, self._pending[:0]
        n_new, t0 = len(draft) + 1 - len(pending), time.perf_counter()
        logits = iter(self.target.sync(ctx + draft, n_new, decided) if n_new else pending)  # one batch
        if self.cost is not None and n_new and not any(decided):  # fewer rows cost less: not the curve
            self.cost.observe_verify(n_new, time.perf_counter() - t0)
        at = [None if d else next(logits) for d in decided] + [next(logits)]  # the target's logits by position
        rows: list[np.ndarray | None] = []  # at each emitted position, under the grammar

        def p_at(i: int) -> Dist:  # called for i = 0, 1, ... while the draft holds
            row = at[i]
            if grammar is not None:
                if i:
                    grammar.advance(draft[i - 1])
                row = None if row is None else grammar.mask(row)
            rows.append(row)
            return OneHot(draft[i]) if row is None else process(row, sampler)

        tokens, n = sampling.verify(p_at, draft, len(ctx))
        if grammar is not None:
            grammar.advance(tokens[-1])
        self.target.trim(len(ctx) + n)  # keep the accepted prefix; the new token is decoded next round
        for d in self.planner.drafters:
            d.rewind(len(ctx) + n)
        self.planner.observe(ctx + tokens, Plan(plan.drafter, len(draft)), n)
        top = self._top_logprobs
        logprobs = [token_logprob(r, t, top) for r, t in zip(rows, tokens, strict=True)] if top is not None else []
        return Round(tokens, n, plan.drafter, len(draft), logprobs)

    def check_prompt(self, prompt: list[int]) -> None:
        """Refuse a prompt that is empty (LocalspecError) or does not fit the context (ContextFull)."""
        if not prompt:
            raise LocalspecError("the prompt is empty")
        if len(prompt) >= self.target.n_ctx:
            raise ContextFull(
                f"the prompt is {len(prompt)} tokens and the context holds {self.target.n_ctx} "
                f"({len(prompt) - self.target.n_ctx + 1} too many); raise --ctx or shorten it"
            )

    def _prefill(self, prompt: list[int], st: Stats) -> None:
        self.check_prompt(prompt)
        t0, decoded = time.perf_counter(), self.target.n_decoded
        self._pending = self.target.sync(prompt, 1).copy()  # logits for the first new token, as plain decoding has
        st.prefill_tokens = self.target.n_decoded - decoded
        st.prefill_seconds = time.perf_counter() - t0

    def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        stops: Sequence[str] = (),
        drafters: Sequence[Drafter] = (),
        *,
        stats: Stats | None = None,
        completion: list[int] | None = None,
        grammar: Constraint | None = None,
        logprobs: list[TokenLogprob] | None = None,
        top_logprobs: int = 0,
        fill: bool = False,
        sampler: SamplerSettings | None = None,
        seed: int | None = None,
        max_draft: int | None = None,
    ) -> Generator[Piece, None, None]:
        """Stream the completion of `prompt`; `stats`, `completion` and `logprobs` (the caller's) fill in
        as it goes (`logprobs` with `top_logprobs` alternatives at each token).

        `drafters` join the engine's own for this generation only (a prediction of the output, say);
        `grammar` constrains the output (a fresh Constraint, at the grammar's start); `fill` says the prompt is
        a fill-in-the-middle's (the output is new text between its prefix and suffix). `sampler` and `seed` are
        this generation's own (default: the engine's sampler, and its running sampling stream); `max_draft` caps the
        tokens any round drafts (0: none).
        """
        start = time.perf_counter()
        st = Stats() if stats is None else stats
        st.prompt_tokens = len(prompt)
        out = [] if completion is None else completion
        self.planner.drafters = [*drafters, *self.drafters]
        for d in self.planner.drafters:
            d.start(len(prompt), fill=fill)
        stream, ctx = TextStream(stops), list(prompt)
        self._prefill(ctx, st)
        self._grammar, self._top_logprobs = grammar, None if logprobs is None else top_logprobs
        self._sampler = self.sampler if sampler is None else sampler
        self._sampling = self.sampling if seed is None else InvariantSampling(seed)
        t0, target0, draft0 = time.perf_counter(), self.target.decode_seconds, self._draft_seconds()
        try:
            while st.completion_tokens < max_tokens and len(ctx) < self.target.n_ctx:
                room = min(max_tokens - st.completion_tokens - 1, self.target.n_ctx - len(ctx))
                room = room if max_draft is None else min(room, max_draft)
                r = self._step(ctx, room)
                st.target_passes, st.drafted, st.accepted = (
                    st.target_passes + 1,
                    st.drafted + r.drafted,
                    st.accepted + r.accepted,
                )
                if r.drafter is not None:
                    st.drafted_by[r.drafter.name] = st.drafted_by.get(r.drafter.name, 0) + r.drafted
                    st.accepted_by[r.drafter.name] = st.accepted_by.get(r.drafter.name, 0) + r.accepted
                for i, tok in enumerate(r.tokens):
                    if self.target.is_eog(tok):
                        st.finish_reason = "stop"
                        break
                    ctx.append(tok)
                    out.append(tok)
                    if logprobs is not None:
                        logprobs.append(r.logprobs[i])
                    st.completion_tokens += 1
                    if text := stream.feed(self.target.piece(tok)):
                        if st.first_token_seconds is None:
                            st.first_token_seconds = time.perf_counter() - start
                        yield Piece(text, i < r.accepted)
                    if stream.stopped:
                        st.finish_reason = "stop"
                        return
                    if st.completion_tokens >= max_tokens:
                        break
                if st.finish_reason == "stop":
                    break
            if tail := stream.feed(b"", final=True):
                yield Piece(tail, False)
        finally:
            self._grammar = self._top_logprobs = None
            st.wall_seconds = time.perf_counter() - t0
            if st.first_token_seconds is None:
                st.first_token_seconds = time.perf_counter() - start
            st.target_seconds = self.target.decode_seconds - target0
            st.draft_seconds = self._draft_seconds() - draft0
            self.busy_seconds += time.perf_counter() - start

    def _draft_seconds(self) -> float:
        return sum(d.seconds for d in self.planner.drafters)

    def drafter(self, name: str) -> Drafter | None:
        """The drafter registered under `name`, if any."""
        return next((d for d in self.drafters if d.name == name), None)
