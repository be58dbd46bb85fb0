"""The speculative decoding loop: draft k tokens, verify them in one target batch, trim the caches."""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

from localspec.core.grammar import Constraint
from localspec.core.meter import Meter
from localspec.core.sampling import InvariantSampling, SamplerSettings, TokenLogprob
from localspec.core.stats import Piece, Stats
from localspec.core.text import TextStream
from localspec.decoding.planner import Planner
from localspec.decoding.round import Round
from localspec.drafting.base import Drafter
from localspec.drafting.costs import CostModel
from localspec.errors import LocalspecError
from localspec.llama.model import ContextFull, Model
from localspec.llama.prompts import HOLD_SECONDS


@dataclass(frozen=True)
class Request:
    """One generation's asking, whole: the engine keeps none of it.

    `drafters` join the engine's own for this generation only (a prediction of the output, say); `grammar`
    constrains the output (a fresh Constraint, at the grammar's start); `top_logprobs` asks for each token's
    log-probability with so many alternatives (None: none); `fill` says the prompt is a fill-in-the-middle's;
    `max_draft` caps the tokens any round drafts (0: none); `cache_key` names the conversation whose newest cached
    state the prompt cache holds for `cache_hold` seconds after its last use. The same seed gives the same text
    whatever drafts.
    """

    prompt: tuple[int, ...]
    max_tokens: int
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    seed: int = 0
    stops: tuple[str, ...] = ()
    drafters: tuple[Drafter, ...] = ()
    grammar: Constraint | None = None
    top_logprobs: int | None = None
    fill: bool = False
    max_draft: int | None = None
    cache_key: str | None = None
    cache_hold: float = HOLD_SECONDS


class Engine:
    """Speculative sampling of `target` with any drafters (the planner picks one, or none, each round).

    The engine holds what generations share: the models (the target, and the drafters with what they
    learned), the cost model and the draft length k (None: the cost-aware choice of each round, which
    needs `cost`); `max_draft` caps every round's draft (exact batches: llama.model.exact_rows). Each
    generation is a Run of its own Request.
    """

    def __init__(
        self,
        target: Model,
        drafters: Sequence[Drafter],
        k: int | None,
        *,
        cost: CostModel | None = None,
        max_draft: int | None = None,
    ) -> None:
        self.target, self.drafters, self.k, self.cost, self.max_draft = target, list(drafters), k, cost, max_draft
        self.busy_seconds = 0.0  # spent generating (prefill and decode), all generations

    def check_prompt(self, prompt: Sequence[int]) -> None:
        """Refuse a prompt that is empty (LocalspecError) or does not fit the context (ContextFull)."""
        if not prompt:
            raise LocalspecError("the prompt is empty")
        if len(prompt) >= self.target.n_ctx:
            raise ContextFull(
                f"the prompt is {len(prompt)} tokens and the context holds {self.target.n_ctx} "
                f"({len(prompt) - self.target.n_ctx + 1} too many); raise --ctx or shorten it"
            )

    def generate(self, request: Request) -> Run:
        """The generation of `request`, run as it is iterated (one at a time: the target's cache is shared)."""
        return Run(self, request)


class Run:
    """One generation: iterate it (once) for Pieces. It owns its sampling stream, grammar, drafters and
    figures: `stats`, `tokens` (the completion's) and `logprobs` (when asked for) fill in as it goes."""

    def __init__(self, engine: Engine, request: Request) -> None:
        self.engine, self.request, self.target = engine, request, engine.target
        self.stats = Stats()
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] | None = None if request.top_logprobs is None else []
        self.planner = Planner([*request.drafters, *engine.drafters], k=engine.k, cost=engine.cost)
        self.round = Round(
            engine.target,
            self.planner,
            request.sampler,
            InvariantSampling(request.seed),
            request.grammar,
            engine.cost,
            Meter(),
            request.top_logprobs,
        )
        self._caps = [c for c in (request.max_draft, engine.max_draft) if c is not None]  # on any round's draft
        self.started = False

    def _prefill(self, prompt: list[int]) -> None:
        self.engine.check_prompt(prompt)
        st, t0, decoded, target = self.stats, time.perf_counter(), self.target.n_decoded, self.target
        if target.prompts is not None:
            target.prompts.use(self.request.cache_key, self.request.cache_hold)
        self.round.pending = target.sync(prompt, 1, prompt=True).copy()  # the first token's, as plain decoding has
        st.prefill_tokens, st.cache_miss = target.n_decoded - decoded, target.cache_miss
        st.prefill_seconds = time.perf_counter() - t0
        if self.engine.cost is not None and st.prefill_tokens > 1:  # what a batch saves, in the first answer too
            self.engine.cost.observe_prefill(st.prefill_tokens, st.prefill_seconds)

    def __iter__(self) -> Generator[Piece, None, None]:
        if self.started:
            raise RuntimeError("a generation can be iterated only once")
        self.started = True
        start, req, st, out, target = time.perf_counter(), self.request, self.stats, self.tokens, self.target
        st.prompt_tokens = len(req.prompt)
        for d in self.planner.drafters:
            d.begin(len(req.prompt), fill=req.fill)
        stream, ctx = TextStream(req.stops), list(req.prompt)
        self._prefill(ctx)
        t0 = time.perf_counter()
        try:
            while st.completion_tokens < req.max_tokens and len(ctx) < target.n_ctx:
                room = min(req.max_tokens - st.completion_tokens - 1, target.n_ctx - len(ctx), *self._caps)
                r = self.round(ctx, room)
                times = self.round.meter.times
                st.target_seconds += times.decoding("verify")
                st.draft_seconds += sum(seconds for n, seconds in times.decodes["draft"] if n)
                st.count_round(r.drafter.name if r.drafter else None, r.drafted, r.accepted)
                for i, tok in enumerate(r.tokens):
                    if target.is_eog(tok):
                        st.finish_reason = "stop"
                        break
                    ctx.append(tok)
                    out.append(tok)
                    if self.logprobs is not None:
                        self.logprobs.append(r.logprobs[i])
                    st.completion_tokens += 1
                    if text := stream.feed(target.piece(tok)):
                        if st.first_token_seconds is None:
                            st.first_token_seconds = time.perf_counter() - start
                        yield Piece(text, i < r.accepted)
                    if stream.stopped:
                        st.finish_reason, st.stop_sequence = "stop", stream.matched
                        return
                    if st.completion_tokens >= req.max_tokens:
                        break
                if st.finish_reason == "stop":
                    break
            if tail := stream.feed(b"", final=True):
                yield Piece(tail, False)
        finally:
            st.wall_seconds = time.perf_counter() - t0
            if st.first_token_seconds is None:
                st.first_token_seconds = time.perf_counter() - start
            target.remember()  # the prompt and answer, for a later prompt that repeats them
            for d in self.planner.drafters:
                d.end(ctx)
            self.engine.busy_seconds += time.perf_counter() - start
