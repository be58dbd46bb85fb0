"""The speculative decoding loop: draft k tokens, verify them in one target batch, trim the caches."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

from localspec.core.sampling import InvariantSampling, SamplerSettings, process
from localspec.core.stats import Piece, Stats
from localspec.core.text import TextStream
from localspec.decoding.planner import NONE, Planner
from localspec.drafting.base import Drafter
from localspec.drafting.costs import CostModel
from localspec.errors import LocalspecError
from localspec.llama.model import ContextFull, Model


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
        self.notes: list[str] = []  # one-line remarks for the user (a draft model left out, say)
        self._pending = np.empty((0, target.n_vocab), np.float32)  # target logits already computed

    @property
    def k(self) -> int | None:
        return self.planner.k

    @k.setter
    def k(self, value: int | None) -> None:
        self.planner.k = value

    def _step(self, ctx: list[int], room: int) -> tuple[list[int], int, Drafter | None, int]:
        """One round on ctx: emitted tokens, accepted draft tokens, the drafter, drafted tokens.

        The target cache holds ctx[:-1], or all of ctx when the prefill left the next logits pending.
        """
        # Right after the prefill the next token's logits are at hand: emit it before any draft is verified
        # (the first token comes as soon as the target alone's would; drafting starts from the next round).
        plan = NONE if len(self._pending) else self.planner.plan(ctx, room)
        draft = plan.drafter.draft(ctx, plan.k, self.sampler, self.sampling) if plan.drafter else []
        pending, self._pending = self._pending, self._pending[:0]
        n_new, t0 = len(draft) + 1 - len(pending), time.perf_counter()
        logits = self.target.sync(ctx + draft, n_new)  # one batch: all new positions, their logits only
        if len(pending):
            logits = np.concatenate([pending, logits])
        if self.cost is not None and n_new:
            self.cost.observe_verify(n_new, time.perf_counter() - t0)
        tokens, n = self.sampling.verify(lambda i: process(logits[i], self.sampler), draft, len(ctx))
        self.target.trim(len(ctx) + n)  # keep the accepted prefix; the new token is decoded next round
        for d in self.planner.drafters:
            d.rewind(len(ctx) + n)
        self.planner.observe(ctx + tokens, plan, n)
        return tokens, n, plan.drafter, len(draft)

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
    ) -> Iterator[Piece]:
        """Stream the completion of `prompt`; `stats` and `completion` (the caller's) fill in as it goes.

        `drafters` join the engine's own for this generation only (a prediction of the output, say).
        """
        start = time.perf_counter()
        st = Stats() if stats is None else stats
        st.prompt_tokens = len(prompt)
        out = [] if completion is None else completion
        self.planner.drafters = [*drafters, *self.drafters]
        for d in self.planner.drafters:
            d.start(len(prompt))
        stream, ctx = TextStream(stops), list(prompt)
        self._prefill(ctx, st)
        t0, target0, draft0 = time.perf_counter(), self.target.decode_seconds, self._draft_seconds()
        try:
            while st.completion_tokens < max_tokens and len(ctx) < self.target.n_ctx:
                room = min(max_tokens - st.completion_tokens - 1, self.target.n_ctx - len(ctx))
                tokens, n, drafter, k = self._step(ctx, room)
                st.target_passes, st.drafted, st.accepted = st.target_passes + 1, st.drafted + k, st.accepted + n
                if drafter is not None:
                    st.drafted_by[drafter.name] = st.drafted_by.get(drafter.name, 0) + k
                    st.accepted_by[drafter.name] = st.accepted_by.get(drafter.name, 0) + n
                for i, tok in enumerate(tokens):
                    if self.target.is_eog(tok):
                        st.finish_reason = "stop"
                        break
                    ctx.append(tok)
                    out.append(tok)
                    st.completion_tokens += 1
                    if text := stream.feed(self.target.piece(tok)):
                        if st.first_token_seconds is None:
                            st.first_token_seconds = time.perf_counter() - start
                        yield Piece(text, i < n)
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
            st.wall_seconds = time.perf_counter() - t0
            if st.first_token_seconds is None:
                st.first_token_seconds = time.perf_counter() - start
            st.target_seconds = self.target.decode_seconds - target0
            st.draft_seconds = self._draft_seconds() - draft0

    def _draft_seconds(self) -> float:
        return sum(d.seconds for d in self.planner.drafters)

    def drafter(self, name: str) -> Drafter | None:
        """The drafter registered under `name`, if any."""
        return next((d for d in self.drafters if d.name == name), None)
