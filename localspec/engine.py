"""The speculative decoding loop: draft k tokens, verify them in one target batch, trim both caches."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

import numpy as np

from localspec.controller import CostModel, Plan, Planner
from localspec.errors import LocalspecError
from localspec.model import ContextFull, Model
from localspec.ngram import LineJoin, NgramDrafter
from localspec.sampling import OneHot, SamplerSettings, process, sample, verify
from localspec.text import TextStream


@dataclass
class Stats:
    """Counters of one generation (decode time excludes prefill)."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually decoded (the rest was already cached)
    completion_tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0
    target_seconds: float = 0.0  # inside llama_decode during decoding: the target ...
    draft_seconds: float = 0.0  # ... and the draft model (the rest of wall_seconds is Python)
    finish_reason: str = "length"

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float | None:
        return self.completion_tokens / self.target_passes if self.target_passes else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.completion_tokens / self.wall_seconds if self.wall_seconds > 0 else None

    def add(self, other: "Stats") -> None:
        """Accumulate another generation's counters (session totals)."""
        for name in ("prompt_tokens", "prefill_tokens", "completion_tokens", "target_passes", "drafted",
                     "accepted", "prefill_seconds", "wall_seconds", "target_seconds", "draft_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> str:
        """One human line: tokens, tok/s, acceptance, tokens per pass, prefill."""
        parts = [f"{self.completion_tokens} tokens in {self.wall_seconds:.2f} s"]
        if self.tokens_per_second:
            parts.append(f"{self.tokens_per_second:.1f} tok/s")
        if self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted})")
        if self.drafted and self.tokens_per_pass:  # plain decoding is one token a pass by definition
            parts.append(f"{self.tokens_per_pass:.2f} tokens/pass")
        parts.append(f"prefill {self.prefill_tokens} tokens in {self.prefill_seconds:.2f} s")
        return " · ".join(parts)

    def to_dict(self) -> dict:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate,
                "tokens_per_pass": self.tokens_per_pass, "tokens_per_second": self.tokens_per_second}


@dataclass(frozen=True)
class Piece:
    """Text of one emitted token; drafted says it was a draft token the target accepted."""

    text: str
    drafted: bool


class Engine:
    """Speculative sampling of `target`: each round a draft (model or n-gram copy) proposes tokens.

    k is the draft length, or None for the cost-aware choice of each round (needs `cost`).
    """

    def __init__(self, target: Model, draft: Model | None, sampler: SamplerSettings, k: int | None,
                 seed: int, *, ngram: bool = False, cost: CostModel | None = None) -> None:
        self.target, self.draft, self.sampler, self.cost = target, draft, sampler, cost
        drafter = NgramDrafter(LineJoin(target.piece, target.tokenize)) if ngram else None
        self.planner = Planner(model=draft is not None, ngram=drafter, k=k, cost=cost)
        self.rng = np.random.default_rng(seed)
        self.stats = Stats()
        self.completion: list[int] = []
        self._pending = np.empty((0, target.n_vocab), np.float32)  # target logits already computed

    @property
    def k(self) -> int | None:
        return self.planner.k

    @k.setter
    def k(self, value: int | None) -> None:
        self.planner.k = value

    def _draft(self, ctx: list[int], plan: Plan) -> tuple[list[int], list[np.ndarray | OneHot]]:
        """The draft tokens of a plan and the distribution q each was drawn from."""
        if plan.kind == "ngram":
            return list(plan.tokens), [OneHot(t) for t in plan.tokens]
        draft: list[int] = []
        q: list[np.ndarray | OneHot] = []
        for _ in range(plan.k):  # the draft model proposes one token at a time, keeping each q
            t0, n0 = time.perf_counter(), self.draft.n_decoded
            q.append(self._pad(process(self.draft.sync(ctx + draft)[-1], self.sampler)))
            if self.cost is not None and self.draft.n_decoded - n0 == 1:
                self.cost.observe_draft(time.perf_counter() - t0)
            draft.append(sample(q[-1], self.rng))
        return draft, q

    def _pad(self, q: np.ndarray | OneHot) -> np.ndarray | OneHot:
        """q over the target's vocabulary: tokens beyond the draft's (padding) get probability 0."""
        if isinstance(q, OneHot) or q.size == self.target.n_vocab:
            return q
        return np.pad(q, (0, self.target.n_vocab - q.size))

    def _step(self, ctx: list[int], room: int) -> tuple[list[int], int, int]:
        """One round on ctx: emitted tokens, accepted draft tokens, drafted tokens.

        The target cache holds ctx[:-1], or all of ctx when the prefill left the next logits pending.
        """
        plan = self.planner.plan(ctx, room)
        draft, q = self._draft(ctx, plan)
        pending, self._pending = self._pending, self._pending[:0]
        n_new, t0 = len(draft) + 1 - len(pending), time.perf_counter()
        logits = self.target.sync(ctx + draft, n_new)  # one batch: all new positions, their logits only
        if len(pending):
            logits = np.concatenate([pending, logits])
        if self.cost is not None and n_new:
            self.cost.observe_verify(n_new, time.perf_counter() - t0)
        tokens, n = verify(lambda i: process(logits[i], self.sampler), q, draft, self.rng)
        self.target.trim(len(ctx) + n)  # keep the accepted prefix; the new token is decoded next round
        if self.draft is not None:
            self.draft.trim(min(len(self.draft.tokens), len(ctx) + n))
        self.planner.observe(ctx + tokens, plan, n)
        return tokens, n, len(draft)

    def _prefill(self, prompt: list[int]) -> None:
        if not prompt:
            raise LocalspecError("the prompt is empty")
        if len(prompt) >= self.target.n_ctx:
            raise ContextFull(f"the prompt is {len(prompt)} tokens and the context holds {self.target.n_ctx} "
                              f"({len(prompt) - self.target.n_ctx + 1} too many); raise --ctx or shorten it")
        t0, decoded = time.perf_counter(), self.target.n_decoded
        self._pending = self.target.sync(prompt, 1).copy()  # logits for the first new token, as plain decoding has
        self.stats.prefill_tokens = self.target.n_decoded - decoded
        if self.draft is not None:
            self.draft.sync(prompt[:-1], 0)
        self.stats.prefill_seconds = time.perf_counter() - t0

    def generate(self, prompt: list[int], max_tokens: int, stops: Sequence[str] = ()) -> Iterator[Piece]:
        """Stream the completion of `prompt`; self.stats and self.completion fill in as it goes."""
        self.stats, self.completion = Stats(prompt_tokens=len(prompt)), []
        if self.planner.ngram is not None:
            self.planner.ngram.start(len(prompt))
        st, stream, ctx = self.stats, TextStream(stops), list(prompt)
        self._prefill(ctx)
        t0, target0, draft0 = time.perf_counter(), self.target.decode_seconds, self._draft_seconds()
        try:
            while st.completion_tokens < max_tokens and len(ctx) < self.target.n_ctx:
                room = min(max_tokens - st.completion_tokens - 1, self.target.n_ctx - len(ctx))
                tokens, n, k = self._step(ctx, room)
                st.target_passes, st.drafted, st.accepted = st.target_passes + 1, st.drafted + k, st.accepted + n
                for i, tok in enumerate(tokens):
                    if self.target.is_eog(tok):
                        st.finish_reason = "stop"
                        break
                    ctx.append(tok)
                    self.completion.append(tok)
                    st.completion_tokens += 1
                    if text := stream.feed(self.target.piece(tok)):
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
            st.target_seconds = self.target.decode_seconds - target0
            st.draft_seconds = self._draft_seconds() - draft0

    def _draft_seconds(self) -> float:
        return self.draft.decode_seconds if self.draft is not None else 0.0
