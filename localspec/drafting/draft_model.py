"""Drafting with a small model of the target's vocabulary: sampled proposals, tracked acceptance.

The draft's KV cache is brought up to date only when it drafts (a catch-up the planner prices in),
so a generation that never uses it never pays for its prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from localspec.core.sampling import InvariantSampling, SamplerSettings, process
from localspec.drafting.base import Drafter
from localspec.drafting.costs import CostModel, amortized, best_k

if TYPE_CHECKING:
    from localspec.llama.model import Model

PROBE_ALPHA = 0.9  # the acceptance rate a probe hopes for: a good draft on easy text
# How much faster than the target alone a draft model must promise at PROBE_ALPHA to be loaded at all: its
# load (a second, and its memory) is paid on every run, and a one-token cost calibrated just after a load
# reads high. A Q8_0 target on a 2-core EPYC promised 1.15-1.30x and ran the decode at 1.0x (0.93x end to
# end); where it wins (a Q8_0 or F16 target on an Intel Xeon: 1.75-1.94x decode, a GPU) it promises more.
WIN_MARGIN = 1.25
# A draft model on trial (calibration.decide_draft) drafts TRIAL_K tokens in this many rounds where nothing
# else drafts, whatever its price (a guess until then), so that its costs and acceptance are measured.
TRIAL_ROUNDS, TRIAL_K = 4, 4
# A draft model on trial drafts its rounds only once an answer is this long: a shorter one never pays for its load
# and catch-up (a short answer on a Q8_0 target ran 0.86x of the target alone when it did).
MIN_ANSWER = 32
# Rounds of the draft model's own after which a session's realized speedup judges it (fewer: its costs do).
JUDGED_ROUNDS = 8
_CATCH_UP = 16  # the fewest tokens of a catch-up whose time per token is taken for the draft's batched cost


PRIOR_WEIGHT = 5.0  # a kept agreement counts as this many drafted tokens when a run starts
CONFIDENCE_DECAY = 0.95  # per position: the target's recent confidence spans about its last 20 tokens


@dataclass
class Acceptance:
    """The draft model's per-token acceptance rate alpha, predicted as its `agreement` times the target's recent
    `confidence` (its top probability at temperature 1, averaged over recent positions).

    How often a draft token holds follows how sure the target is of the text: the 0.5B draft of the 1.5B
    Qwen2.5-Coder target, 128 tokens each, accepted 0.58-0.94 of its tokens on an open chat, an explanation,
    SQL and code, at 0.93-1.10 times the target's mean top probability there (greedy and at T 0.8). So the
    agreement is learned from the drafted rounds (decayed counts: accepted tokens over the confidence-weighted
    trials), carried from run to run, and what the text is like now comes from the target's own decodes, which
    every round computes anyway: prose the draft would not keep is seen before the draft model is loaded.
    """

    accepted: float = PRIOR_WEIGHT  # decayed accepted draft tokens (the prior's included)
    weighted: float = PRIOR_WEIGHT  # decayed trials (accepted tokens and rejections), each weighted by confidence
    sure: float = 0.8  # decayed sum of the target's top probability at recent positions (a prior's one included)
    positions: float = 1.0  # decayed count of those positions
    decay: float = 0.95  # per drafted round

    @classmethod
    def prior(cls, agreement: float) -> Acceptance:
        """A fresh estimate whose agreement starts at `agreement` (what earlier runs learned), PRIOR_WEIGHT strong."""
        return cls(accepted=agreement * PRIOR_WEIGHT, weighted=PRIOR_WEIGHT)

    @property
    def agreement(self) -> float:
        return self.accepted / self.weighted

    @property
    def confidence(self) -> float:
        """The target's recent mean top probability."""
        return self.sure / self.positions

    @property
    def alpha(self) -> float:
        return min(self.agreement * self.confidence, 0.99)

    def observe(self, drafted: int, accepted: int, confidence: Sequence[float] = ()) -> None:
        """Fold in a round: its `accepted` of `drafted` draft tokens (none: the round was not this draft's), and
        the target's top probability at each of its emitted positions (empty: no logits were computed)."""
        here = sum(confidence) / len(confidence) if confidence else self.confidence
        if drafted:
            trials = accepted + (accepted < drafted)
            self.accepted = self.decay * self.accepted + accepted
            self.weighted = self.decay * self.weighted + trials * here
        for p in confidence:
            self.sure = CONFIDENCE_DECAY * self.sure + p
            self.positions = CONFIDENCE_DECAY * self.positions + 1

    def survival(self, k_max: int) -> list[float]:
        a = self.alpha
        return [a**j for j in range(1, k_max + 1)]


def margin(cost: CostModel, *, room: int = 16, setup: float = 0.0) -> float:
    """How far a draft model with these costs clears WIN_MARGIN at PROBE_ALPHA: its promised speedup over the
    target alone (amortizing `setup` seconds over `room` tokens) divided by WIN_MARGIN; 0 where no k wins."""
    survival = [PROBE_ALPHA**j for j in range(1, min(room, DraftModelDrafter.max_k) + 1)]
    k, rate = best_k(survival, cost, cost.draft_token)
    return amortized(rate, setup, room) * cost.verify_cost(1) / WIN_MARGIN if k else 0.0


def model_can_win(cost: CostModel, *, room: int = 16, setup: float = 0.0) -> bool:
    """Whether a draft model with these costs would beat the target alone by WIN_MARGIN at PROBE_ALPHA.

    On a CPU, where a batch of k tokens costs nearly k single decodes, it never does with a Q4_K target:
    the draft model is then not worth loading at all.
    """
    return margin(cost, room=room, setup=setup) > 1


@dataclass
class Realized:
    """What the draft model's rounds took (`seconds`, its catch-ups included) against what the target alone
    would have taken for the same tokens (`alone`: a one-token decode each)."""

    seconds: float = 0.0
    alone: float = 0.0
    rounds: int = 0

    def add(self, seconds: float, alone: float) -> None:
        self.seconds, self.alone, self.rounds = self.seconds + seconds, self.alone + alone, self.rounds + 1

    def speedup(self, load_seconds: float) -> float | None:
        """The session's realized speedup of the answer's draft-model rounds, its load included (1.0: even);
        None before JUDGED_ROUNDS rounds."""
        if self.rounds < JUDGED_ROUNDS:
            return None
        return self.alone / max(self.seconds + load_seconds, 1e-9)


class DraftModelDrafter(Drafter):
    """Drafts by sampling a small model token by token, keeping each token's distribution q.

    Under automatic k, once loaded, it is re-probed with k = 1 now and then while it loses (backing off), so
    the choice can switch back when the text gets easier.
    """

    name = "draft_model"
    max_k: ClassVar[int] = 16
    confident = True

    def __init__(
        self,
        model: Model | Callable[[], Model],
        cost: CostModel | None = None,
        *,
        trial: bool = False,
        path: Path | None = None,
        agreement: float = 1.0,
        load_seconds: float = 0.0,
    ) -> None:
        """`model`: the draft model, or a function loading it at its first draft (then `path` names its file, and
        `load_seconds` what that load is expected to take, priced into its first draft). `agreement`: what earlier
        runs learned of its acceptance against the target's confidence (Acceptance)."""
        self._load = model if callable(model) else None
        self.loaded: Model | None = None if callable(model) else model
        self.path = path if path is not None else Path(model.path)  # type: ignore[union-attr]
        self.cost = cost
        self.acceptance = Acceptance.prior(agreement)
        self.load_seconds = load_seconds
        self.trial_rounds = TRIAL_ROUNDS if trial else 0  # on trial: drafts TRIAL_K this often, to be measured
        self.min_answer = MIN_ANSWER  # its trial rounds wait for an answer this long
        self.realized = Realized()  # what its rounds took against the target alone's time for their tokens
        self._answer_start = 0  # where the answer began
        self.probe_every, self._since = 8, 0  # rounds between probes, rounds since it last drafted
        self._probing = False
        self._round_start = 0.0

    @property
    def model(self) -> Model:
        """The draft model, loaded now if it was not yet."""
        if self.loaded is None:
            assert self._load is not None
            self.loaded = self._load()
        return self.loaded

    def reset(self) -> None:
        if self.loaded is not None:
            self.loaded.reset()

    def start(self, prompt_len: int, *, fill: bool = False) -> None:
        self._answer_start = prompt_len

    def survival(self, ctx: list[int], k_max: int) -> list[float]:
        return self.acceptance.survival(k_max)

    def horizon(self, ctx: list[int], room: int) -> int:
        """Not loaded yet: the answer so far, as long as the rest is likely to be (ski rental: it is loaded once
        it would have saved its load and catch-up on the tokens so far, so a short answer never pays for it and
        a long one loses at most that); loaded: the room left."""
        return room if self.loaded is not None else min(room, len(ctx) - self._answer_start)

    def token_seconds(self, cost: CostModel) -> float:
        return cost.draft_token

    def setup_seconds(self, ctx: list[int], cost: CostModel) -> float:
        """Its load where it was not loaded yet, and its catch-up on ctx."""
        cached = self.loaded.tokens if self.loaded is not None else []
        if cached != ctx[: len(cached)]:
            cached = []  # a different context: llama.cpp keeps the common prefix, the estimate errs high
        behind = len(ctx) - 1 - len(cached)  # the last token is decoded anyway, as part of the first draft
        load = self.load_seconds if self.loaded is None else 0.0
        return load + max(behind, 0) * cost.draft_prefill_token

    def probe(self, ctx: list[int], room: int, cost: CostModel) -> int:
        if self.trial_rounds > 0 and len(ctx) - self._answer_start >= self.min_answer:
            self.trial_rounds -= 1
            return min(TRIAL_K, room)
        if self.loaded is None:  # a probe never loads it: only a draft its price says wins does
            return 0
        if self._since < self.probe_every or not model_can_win(cost, room=room, setup=self.setup_seconds(ctx, cost)):
            return 0
        self._probing = True
        return 1

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        out: list[int] = []
        model = self.model  # loaded first, where it was not yet: its load is no part of any timing
        self._round_start = time.perf_counter()
        for _ in range(k):
            t0, n0 = time.perf_counter(), model.n_decoded
            logits = model.sync(ctx + out)[-1]  # catches up on ctx first when behind
            if self.cost is not None and (n := model.n_decoded - n0) == 1:
                self.cost.observe_draft(time.perf_counter() - t0)
            elif self.cost is not None and n >= _CATCH_UP:
                self.cost.observe_draft_prefill((time.perf_counter() - t0) / n)
            out.append(sampling.pick(process(logits, sampler), len(ctx) + len(out)))  # the target's own noise
        return out

    def observe(
        self, ctx: list[int], by: Drafter | None, drafted: int, accepted: int, confidence: Sequence[float] = ()
    ) -> None:
        self.acceptance.observe(drafted if by is self else 0, accepted, confidence)
        if by is not self:
            self._since += 1
            return
        if self.cost is not None:  # the round's time against the target alone's for the same tokens
            self.realized.add(time.perf_counter() - self._round_start, (accepted + 1) * self.cost.verify_cost(1))
        if self._probing and self.cost is not None:
            won = best_k(self.acceptance.survival(self.max_k), self.cost, self.cost.draft_token)[0] > 0
            self.probe_every = 8 if won else min(2 * self.probe_every, 256)
        self._probing = False
        self._since = 0

    def rewind(self, n: int) -> None:
        if self.loaded is not None:
            self.loaded.trim(min(len(self.loaded.tokens), n))

    @property
    def seconds(self) -> float:
        return self.loaded.decode_seconds if self.loaded is not None else 0.0
