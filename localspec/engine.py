"""The speculative decoding loop: draft k tokens, verify them in one target batch, trim both caches."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

import numpy as np

from localspec.errors import LocalspecError
from localspec.model import ContextFull, Model
from localspec.sampling import SamplerSettings, process, sample, verify
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
                     "accepted", "prefill_seconds", "wall_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> str:
        """One human line: tokens, tok/s, acceptance, tokens per pass, prefill."""
        parts = [f"{self.completion_tokens} tokens in {self.wall_seconds:.2f} s"]
        if self.tokens_per_second:
            parts.append(f"{self.tokens_per_second:.1f} tok/s")
        if self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted})")
        if self.tokens_per_pass:
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
    """Speculative sampling of `target`, with `draft` proposing k tokens a round (k = 0: target alone)."""

    def __init__(self, target: Model, draft: Model | None, sampler: SamplerSettings, k: int,
                 seed: int) -> None:
        self.target, self.draft, self.sampler = target, draft, sampler
        self.k = k if draft is not None else 0
        self.rng = np.random.default_rng(seed)
        self.stats = Stats()
        self.completion: list[int] = []
        self._pending = np.empty((0, target.n_vocab), np.float32)  # target logits already computed

    def _step(self, ctx: list[int], k: int) -> tuple[list[int], int]:
        """One round on ctx: the emitted tokens, and how many of them were accepted draft tokens.

        The target cache holds ctx[:-1], or all of ctx when the prefill left the next logits pending.
        """
        s, rng = self.sampler, self.rng
        draft: list[int] = []
        q: list[np.ndarray] = []
        for _ in range(k):  # the draft proposes k tokens one at a time, keeping each q
            q.append(process(self.draft.sync(ctx + draft)[-1], s))
            draft.append(sample(q[-1], rng))
        pending, self._pending = self._pending, self._pending[:0]
        logits = np.concatenate([pending, self.target.sync(ctx + draft, k + 1 - len(pending))])  # one batch
        tokens, n = verify(lambda i: process(logits[i], s), q, draft, rng)
        self.target.trim(len(ctx) + n)  # keep the accepted prefix; the new token is decoded next round
        if self.draft is not None:
            self.draft.trim(min(len(self.draft.tokens), len(ctx) + n))
        return tokens, n

    def _prefill(self, prompt: list[int]) -> None:
        if not prompt:
            raise LocalspecError("the prompt is empty")
        if len(prompt) >= self.target.n_ctx:
            raise ContextFull(f"the prompt is {len(prompt)} tokens and the context holds {self.target.n_ctx} "
                              f"({len(prompt) - self.target.n_ctx + 1} too many); raise --ctx or shorten it")
        t0, decoded = time.perf_counter(), self.target.n_decoded
        self._pending = self.target.sync(prompt, 1)  # logits for the first new token, as plain decoding has
        self.stats.prefill_tokens = self.target.n_decoded - decoded
        if self.draft is not None:
            self.draft.sync(prompt[:-1], 0)
        self.stats.prefill_seconds = time.perf_counter() - t0

    def generate(self, prompt: list[int], max_tokens: int, stops: Sequence[str] = ()) -> Iterator[Piece]:
        """Stream the completion of `prompt`; self.stats and self.completion fill in as it goes."""
        self.stats, self.completion = Stats(prompt_tokens=len(prompt)), []
        st, stream, ctx = self.stats, TextStream(stops), list(prompt)
        self._prefill(ctx)
        t0 = time.perf_counter()
        try:
            while st.completion_tokens < max_tokens and len(ctx) < self.target.n_ctx:
                k = max(0, min(self.k, max_tokens - st.completion_tokens - 1, self.target.n_ctx - len(ctx)))
                tokens, n = self._step(ctx, k)
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
