"""Drafting with a small model of the target's vocabulary: sampled proposals, tracked acceptance.

Under its policy the draft model loads on a thread of its own beside the target's work (`BackgroundLoad`): the
target decodes alone meanwhile, and the draft joins at a round boundary once it is ready. Its KV cache is brought
up to date on that thread as far as the context then went, and at its first draft for the rest (a catch-up the
planner prices in), so a generation that never uses it never pays for its prefill.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from localspec.core import meter
from localspec.core.sampling import InvariantSampling, SamplerSettings, process
from localspec.drafting.base import NOTHING, Drafter, Offer, Verdict, wins
from localspec.drafting.costs import CATCH_UP, CostModel, best_k
from localspec.drafting.policy import DraftPolicy, Recheck, Terms
from localspec.drafting.prior import DRAFT_MAX_K, TRIAL_K, clear_win

if TYPE_CHECKING:
    from localspec.llama.model import Model

PRIOR_WEIGHT = 5.0  # a kept agreement counts as this many drafted tokens when a run starts
CONFIDENCE_DECAY = 0.95  # per position: the target's recent confidence spans about its last 20 tokens


@dataclass
class Acceptance:
    """The draft model's per-token acceptance rate alpha, predicted as its `agreement` times the target's recent
    `confidence` (its top probability at temperature 1, averaged over recent positions).

    How often a draft token holds follows how sure the target is of the text (docs/benchmarks.md, "The draft
    model's policy": acceptance near a constant times the target's mean top probability, across texts). So the
    agreement is learned from the drafted rounds (decayed counts: accepted tokens over the confidence-weighted
    trials), carried from run to run, and what the text is like now comes from the target's own decodes, which
    every round computes anyway: prose the draft would not keep is seen before the draft model is loaded.
    """

    accepted: float = PRIOR_WEIGHT  # decayed accepted draft tokens (the prior's included)
    weighted: float = PRIOR_WEIGHT  # decayed trials (accepted tokens and rejections), each weighted by confidence
    sure: float = 0.8  # decayed sum of the target's top probability at recent positions (a prior's one included)
    positions: float = 1.0  # decayed count of those positions
    decay: float = 0.98  # per drafted round: the agreement is the pair's, the text's changes are the confidence's
    held: float = 0.0  # this session's accepted draft tokens, all of them ...
    tried: float = 0.0  # ... and its confidence-weighted trials: what it learned of the agreement, undecayed

    @classmethod
    def prior(cls, agreement: float) -> Acceptance:
        """A fresh estimate whose agreement starts at `agreement` (what earlier runs learned), PRIOR_WEIGHT strong."""
        return cls(accepted=agreement * PRIOR_WEIGHT, weighted=PRIOR_WEIGHT)

    @property
    def agreement(self) -> float:
        return self.accepted / self.weighted

    @property
    def learned(self) -> float | None:
        """The agreement this session's rounds showed, all of them alike (None: it drafted none)."""
        return self.held / self.tried if self.tried > 0 else None

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
            self.held, self.tried = self.held + accepted, self.tried + trials * here
        for p in confidence:
            self.sure = CONFIDENCE_DECAY * self.sure + p
            self.positions = CONFIDENCE_DECAY * self.positions + 1

    def survival(self, k_max: int) -> list[float]:
        a = self.alpha
        return [a**j for j in range(1, k_max + 1)]


class Loading(Protocol):
    """A draft model's load under way beside the target's work."""

    def ready(self) -> bool:
        """Whether it has ended (loaded, failed or cancelled): `result` then returns at once."""

    def result(self) -> Model | None:
        """The loaded model (waiting for it), or None where it failed or was cancelled (said in one line)."""

    def cancel(self) -> None:
        """Stop it and free whatever it loaded; it has ended when this returns."""


Load = Callable[..., "Model"]  # loads the draft model; called with cancel=threading.Event where it may be cancelled
_LOADS: weakref.WeakSet[BackgroundLoad] = weakref.WeakSet()  # under way: cancelled when the process exits


class BackgroundLoad:
    """A draft model loading on a thread of its own (llama.cpp's calls release the GIL), then catching up on
    `tokens` there: nothing waits for it. Cancelled (Ctrl-C, the process or server stopping, a one-shot answer
    ending first), llama.cpp stops reading tensors at its next progress call and what was loaded is freed.

    `beside`: a target decoding on the same CPU cores. It gives one of its threads to the load while it runs (a
    third busy thread on two cores stalls llama.cpp's spinning thread barrier: the target lost 3.1-3.3 s to a
    0.5B draft's load on a 2-core AMD EPYC, which took 4.3-5.1 s), and the catch-up runs on one thread; the
    target takes its threads back when the load is seen to end (on the thread that decodes it)."""

    def __init__(
        self,
        load: Load,
        tokens: Sequence[int] = (),
        *,
        warn: Callable[[str], None] | None = None,
        beside: Model | None = None,
    ) -> None:
        self._load, self._tokens, self._warn = load, list(tokens), warn or _warn
        self._beside = beside if beside is not None and (beside.n_threads or 1) > 1 else None
        if self._beside is not None:
            self._beside.use_threads((self._beside.n_threads or 2) - 1)
        self.cancelled = threading.Event()
        self._model: Model | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="localspec-draft-load", daemon=True)
        _LOADS.add(self)
        self._thread.start()

    def _run(self) -> None:
        try:
            model = self._load(cancel=self.cancelled)
            if len(self._tokens) > 1 and not self.cancelled.is_set():
                if self._beside is not None:  # one thread each, the target's and the catch-up's
                    model.use_threads(1)
                model.sync(self._tokens, 0)  # its catch-up, off the answer's path
                if self._beside is not None:
                    model.use_threads()
            self._model = model
        except BaseException as e:  # reported where the result is asked for, on the thread that asks
            self._error = e

    def ready(self) -> bool:
        if self._thread.is_alive():
            return False
        self._give_back()
        return True

    def _give_back(self) -> None:
        """The target decodes with all its threads again."""
        if self._beside is not None:
            self._beside.use_threads()
            self._beside = None

    def result(self) -> Model | None:
        self._thread.join()
        self._give_back()
        if self._error is not None and not self.cancelled.is_set():
            self._warn(f"localspec: draft model not loaded ({self._error}); the target goes on alone")
            self._error = None
        return self._model

    def cancel(self) -> None:
        self.cancelled.set()
        self._thread.join()
        self._give_back()
        model, self._model = self._model, None
        if model is not None:
            model.close()


def _warn(text: str) -> None:
    print(text, file=sys.stderr)


@atexit.register
def _cancel_loads() -> None:
    """Loads still under way at exit stop before the interpreter does (a daemon thread inside llama.cpp would not)."""
    for load in list(_LOADS):
        load.cancel()


class DraftModelDrafter(Drafter):
    """Drafts by sampling a small model token by token, keeping each token's distribution q.

    With a `policy` (policy.DraftPolicy) it is loaded beside the target's work (`background`) once the policy's
    terms make its offer win over their horizon (from the answer's first round where the policy's choice says it
    is used: every round beside its load is measured, so what the load costs the target is known), offers
    nothing until it is ready, and reports its load (and what the target lost while it ran), rounds and answers
    to the policy as evidence. Under automatic k, once loaded, it rechecks with k = 1 now and then while it loses
    (backing off), so the choice can switch back when the text gets easier. Dropped, its memory is returned.
    """

    name = "draft_model"
    max_k: ClassVar[int] = DRAFT_MAX_K
    confident = True

    def __init__(
        self,
        model: Model | Load,
        cost: CostModel | None = None,
        *,
        policy: DraftPolicy | None = None,
        path: Path | None = None,
        clock: Callable[[], float] = time.perf_counter,
        background: Callable[[Load, Sequence[int]], Loading] = BackgroundLoad,
    ) -> None:
        """`model`: the draft model, or a function loading it (then `path` names its file): beside the target's
        work through `background` under a `policy`, else at its first draft. `policy`: what the session chose
        about it (None: a plain drafter the planner prices). `clock`: the time its loads are measured by (its
        rounds' is their verdict's)."""
        self._load = model if callable(model) else None
        self._background, self._loading = background, None  # type: Callable[[Load, Sequence[int]], Loading], Loading | None
        self._load_started = 0.0  # when its load began (the clock's)
        self.beside = 0.0  # what the target's rounds lost while it loaded: their seconds over their quiet cost
        self.joined: int | None = None  # the answer's token at which it joined (None: not loaded in this answer)
        self.loaded: Model | None = None if callable(model) else model
        self.path = path if path is not None else Path(model.path)  # type: ignore[union-attr]
        self.cost, self.policy, self.clock = cost, policy, clock
        self.acceptance = Acceptance.prior(policy.agreement if policy is not None else 1.0)
        self._answer_start, self._answer = 0, 0  # where the answer began, and its tokens so far
        self.recheck = Recheck()  # when it is tried again while it loses
        self._probe: str | None = None  # the probe its latest offer held ("trial", "recheck"), taken or not
        self._beside_load = False  # whether the round now planned runs beside its load

    @property
    def loading(self) -> Loading | None:
        """Its load under way beside the target's work (None: none is)."""
        return self._loading

    @property
    def model(self) -> Model:
        """The draft model, loaded now if it was not yet (its seconds told to the policy, and to the round's
        meter as work of no tokens: no part of its drafting's time)."""
        if self.loaded is None:
            assert self._load is not None
            t0 = self.clock()
            self.loaded = self._load()
            seconds = self.clock() - t0
            meter.decoded(0, seconds)
            if self.policy is not None:  # on the answer's path: all of its seconds are the target's
                self.policy.loaded(seconds, seconds)
        return self.loaded

    def start_loading(self, ctx: Sequence[int] = ()) -> None:
        """Begin its load beside the target's work (once), to catch up on `ctx` but its last token there."""
        if self.loaded is None and self._loading is None and self._load is not None:
            self._load_started, self.beside = self.clock(), 0.0
            self._loading = self._background(self._load, list(ctx[:-1]))
            self._quiet(False)

    def _quiet(self, quiet: bool) -> None:
        """Whether the machine is its own again: its cost model learns nothing from decodes beside a load."""
        if self.cost is not None:
            self.cost.beside_load = not quiet

    def cancel(self) -> None:
        """Stop a load under way (its memory freed; a later offer may start another)."""
        if self._loading is not None:
            self._loading.cancel()
            self._loading = None
            self._quiet(True)

    def _join(self, answer: int) -> bool:
        """Whether it is loaded now: a load that has ended joins here, at a round boundary."""
        if self._loading is None or not self._loading.ready():
            return self.loaded is not None
        loading, self._loading = self._loading, None
        self.loaded = loading.result()
        self._quiet(True)
        if self.loaded is not None:
            self.joined = answer
            if self.policy is not None:
                self.policy.loaded(self.clock() - self._load_started, self.beside)
        elif self.policy is not None:
            self.policy.dropped = True  # it could not load: the target goes on alone
        return self.loaded is not None

    def _drop(self) -> None:
        """Its policy dropped it: its memory is returned."""
        if self.loaded is not None:
            self.loaded.close()
            self.loaded = None
        self.cancel()

    def reset(self) -> None:
        if self.loaded is not None:
            self.loaded.reset()

    def begin(self, prompt_len: int, *, fill: bool = False) -> None:
        self._answer_start, self._answer, self.joined = prompt_len, 0, None

    def end(self, ctx: Sequence[int]) -> None:
        if self.policy is not None:
            self.policy.answered(self._answer, self.acceptance.learned)
            if not self.policy.session:  # one answer: a load it did not need stops with it
                self.cancel()
        self._answer = 0
        if self.loaded is not None:
            self.loaded.remember()  # its cache follows the target's into the prompt cache

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        """Its acceptance ahead, its token's cost, its load and catch-up, spread over what its policy allows (none
        once dropped); a probe where it is on trial, or loaded and losing but a clear win may be back."""
        if cost is None:
            return Offer(self.acceptance.survival(k_max))
        answer = len(ctx) - self._answer_start
        if self.policy is None:
            terms = Terms(0.0, room, trial=False)
        elif (policy_terms := self.policy.terms(cost, answer=answer, room=room, alpha=self.acceptance.alpha)) is None:
            if self.loaded is not None or self._loading is not None:
                self._drop()
            return NOTHING
        else:
            terms = policy_terms
        setup = terms.load + self._catch_up(ctx) * cost.draft_prefill_token * terms.catch_up
        offer = Offer(self.acceptance.survival(k_max), cost.draft_step, setup, terms.horizon)
        if self.policy is not None and not self._join(answer):  # loaded beside the target once its offer wins
            if self.policy.preload or terms.trial or (terms.horizon and wins(offer, cost, room)):
                self.start_loading(ctx)
            self._beside_load = self._loading is not None
            return NOTHING
        self._probe = "trial" if terms.trial else self._recheck(room, cost, setup)
        probe = {"trial": min(TRIAL_K, room), "recheck": 1}.get(self._probe or "", 0)
        return replace(offer, probe=probe)

    def _catch_up(self, ctx: list[int]) -> int:
        """The tokens its cache is behind ctx (the last is decoded anyway, as part of the first draft)."""
        cached = self.loaded.tokens if self.loaded is not None else []
        if cached != ctx[: len(cached)]:
            cached = []  # a different context: llama.cpp keeps the common prefix, the estimate errs high
        return max(len(ctx) - 1 - len(cached), 0)

    def _recheck(self, room: int, cost: CostModel, setup: float) -> str | None:
        """ "recheck" where, loaded, it has lost a while and a clear win may be back (one token: a recheck never
        loads it); None otherwise."""
        if self.loaded is None or not self.recheck.due or not clear_win(cost, room=room, setup=setup):
            return None
        return "recheck"

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        out: list[int] = []
        model = self.model  # loaded first, where it was not yet
        for _ in range(k):
            logits = model.sync(ctx + out)[-1]  # catches up on ctx first when behind
            out.append(sampling.pick(process(logits, sampler), len(ctx) + len(out)))  # the target's own noise
        return out

    def accept(self, ctx: list[int], verdict: Verdict) -> None:
        if self._beside_load and self.cost is not None:  # a round beside its load: what the target lost
            quiet = self.cost.quiet_round(verdict.drafted, verdict.accepted + 1)
            self.beside += max(verdict.times.total - quiet, 0.0)
        self._beside_load = False
        if self.loaded is not None:  # the target keeps all of ctx but its last token
            self.loaded.trim(min(len(self.loaded.tokens), len(ctx) - 1))
        mine = verdict.by is self
        self.acceptance.observe(verdict.drafted if mine else 0, verdict.accepted, verdict.confidence)
        self._answer = len(ctx) - self._answer_start
        if not mine:
            self.recheck.passed()
            return
        trial = verdict.probe and self._probe == "trial"
        if self.policy is not None and self.cost is not None:  # the round's time against the target alone's
            for n, seconds in verdict.times.decodes["draft"]:
                if n >= CATCH_UP:
                    self.policy.caught_up(seconds)
            self.policy.drafted(verdict.times.total, (verdict.accepted + 1) * self.cost.alone, trial=trial)
        won = None
        if verdict.probe and not trial and self.cost is not None:  # a recheck: whether it wins now
            won = best_k(self.acceptance.survival(self.max_k), self.cost, self.cost.draft_step)[0] > 0
        self.recheck.drafted(won)


def drafters(
    model: Model | Load,
    cost: CostModel | None,
    *,
    policy: DraftPolicy | None,
    path: Path | None = None,
    clock: Callable[[], float] = time.perf_counter,
    background: Callable[[Load, Sequence[int]], Loading] = BackgroundLoad,
) -> list[Drafter]:
    """The draft model's drafters for a session (DraftModelDrafter's arguments): none where its `policy` skips
    it, else it and what the policy measures beside it (DraftPolicy.probes)."""
    if policy is not None and policy.choice == "skip":
        return []
    drafter = DraftModelDrafter(model, cost, policy=policy, path=path, clock=clock, background=background)
    return [drafter, *(policy.probes() if policy is not None else [])]
