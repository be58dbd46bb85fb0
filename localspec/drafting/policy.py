"""The draft-model policy, whole: a prior, evidence, a choice, bounded regret.

Whether a draft model drafts here, and when, is decided here (and in the three files this reads: kept, prior,
probe) and nowhere else:

- **What is kept** per target × draft model (`kept.Kept`, in the cost store beside the target's curve): its measured
  costs, its agreement with the target, its load's seconds, and its verdict (`DraftDecision`).
- **The prior** (`prior.promise`): what a draft model may gain before it has drafted here: a draft token at its size
  bound (`prior.size_bound`), an acceptance of its agreement (kept, else 1) times the target's confidence in this
  answer, against the target's curve as this answer measures it.
- **Each session's choice** (`DraftPolicy.decide`): `named` (the user chose it: it drafts from its first
  answer), `use` (its verdict), `explore` (never measured here and the prior may promise a clear win: it is
  loaded in this answer where the promise is clear), `try` (a measured loser or a borderline promise, tried
  rarely, within BUDGET of the user's seconds), or `skip`.
- **Within an answer** (`DraftPolicy` as DraftModelDrafter asks it): it loads beside the target's work, so its
  load is priced at what it costs the target meanwhile (`Kept.load_price`: as measured here, else by the share of the
  target's speed such a load takes on a machine like this one), not its wall time; one the user named starts
  loading at once; else it starts once its offer would repay that price and its catch-up over the horizon (one
  in use from the answer's first round, one explored after its first tokens; ski rental: the
  rest of the answer as this pair's were long, or at least the answer so far; in a chat or a server, the
  `session`, the rest of what its sessions produce), an explored one only for a clear win; one explored or tried
  is dropped as soon as its realized rounds lose, its memory returned, so its regret is its setup and a few
  rounds.
- **Settling** (`DraftPolicy.settle`): the session's realized speedup (its load included), or where too few of
  its rounds ran the promise of its measured costs, moves the verdict; the seconds lost to an exploration, a
  try or an ended use count against the budget, and each doubles the wait before the next try.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from localspec.drafting.base import Drafter
from localspec.drafting.costs import PROBE_ROWS, CostModel
from localspec.drafting.kept import Choice, Kept
from localspec.drafting.prior import (
    SEEN_TOKENS,
    SIZE_MARGIN,
    TRIAL_ROUNDS,
    beside_share,
    by_size,
    cannot_win,
    clear_win,
    draft_ratio,
    promise,
    try_estimate,
    win_margin,
)
from localspec.drafting.probe import BatchProbe

MIN_ANSWER = 32  # a try's trial waits for an answer this long: a shorter one would not repay its load
# The batch probe waits for a horizon this long (twice SEEN_TOKENS): most short answers end before it, and what it
# measures could not repay a load over fewer tokens on any machine simulated (docs/benchmarks.md).
PROBE_HORIZON = 16
JUDGED_ROUNDS = 8  # its own rounds after which the realized speedup judges a draft model (fewer: its costs do)
# An explored or tried draft model whose judged rounds realize less than this share of the target alone's speed is
# dropped within the answer: below 1 by the spread of eight rounds' acceptance (a draft whose rounds win 1.25x at an
# acceptance of 0.6 realizes less than 0.9 in about one answer in twenty).
DROP_SPEEDUP = 0.9
FORGET_RUNS = 16  # runs without drafting after which a kept agreement below 1 is back at 1 (see agreement)
ANSWER_DECAY = 0.3  # the weight of a new answer's length in the pair's typical length
# The tokens a session (a chat, a server) produces in all, before this pair's sessions were measured: a handful of
# answers; what its sessions produced (a decayed mean) replaces it.
SESSION_TOKENS = 1500
RECHECK_EVERY, RECHECK_MAX = 8, 256  # rounds between rechecks of a losing draft model: at first, at most


@dataclass
class Realized:
    """What the draft model's rounds took (`seconds`, its catch-ups included: `catch_up` of them) against what
    the target alone would have taken for the same tokens (`alone`: a one-token decode each)."""

    seconds: float = 0.0
    alone: float = 0.0
    rounds: int = 0
    catch_up: float = 0.0

    def add(self, seconds: float, alone: float) -> None:
        self.seconds, self.alone, self.rounds = self.seconds + seconds, self.alone + alone, self.rounds + 1

    def speedup(self) -> float | None:
        """Its rounds' realized speedup over the target alone for their tokens, once there are JUDGED_ROUNDS of
        them (None before): what drafting on would give, the catch-ups and the load paid before being sunk (the
        planner prices those in each answer)."""
        if self.rounds < JUDGED_ROUNDS:
            return None
        return self.alone / max(self.seconds - self.catch_up, 1e-9)

    @property
    def losing(self) -> bool:
        """Whether its rounds, judged, lose clearly: below DROP_SPEEDUP of the target alone's speed."""
        speedup = self.speedup()
        return speedup is not None and speedup < DROP_SPEEDUP


@dataclass
class Recheck:
    """When a loaded draft model that loses is tried again with one token (a recheck, where a clear win may be back
    as the text gets easier): once it has not drafted for `every` rounds; each recheck that loses doubles the wait
    (up to RECHECK_MAX), one that wins brings it back to RECHECK_EVERY."""

    every: int = RECHECK_EVERY
    since: int = 0  # rounds since it last drafted

    @property
    def due(self) -> bool:
        return self.since >= self.every

    def passed(self) -> None:
        """A round it did not draft."""
        self.since += 1

    def drafted(self, won: bool | None = None) -> None:
        """It drafted a round: a recheck where `won` says whether its costs and acceptance now win (None: no
        recheck)."""
        if won is not None:
            self.every = RECHECK_EVERY if won else min(2 * self.every, RECHECK_MAX)
        self.since = 0


class Terms(NamedTuple):
    """What the policy allows the draft model's offer now: the seconds of its load priced into its setup (what
    the load costs the target), the tokens its setup is spread over (0: it may not start loading now), whether a
    trial round is due (TRIAL_K tokens whatever their price), and the share of its catch-up's seconds the target
    pays (`beside_share` while it would catch up on its load's thread; 1 on the answer's path)."""

    load: float
    horizon: int
    trial: bool
    catch_up: float = 1.0


@dataclass
class DraftPolicy:
    """One session's policy on one draft model: its choice, what each answer's offers may hold, and the session's
    evidence, which its drafter reports (see the module).

    `bound` is its size bound (target decodes a draft token costs at least); `cost` the session's cost model,
    priced for it by `decide` (a copy: the one `decide` is handed is left as it was); `target_load` the seconds
    the target's load took here (what its first load is estimated from, where none was measured); `session` says
    the engine gives many answers (a chat, a server): its load is priced over the session's tokens."""

    draft_key: str
    name: str
    choice: Choice
    kept: Kept
    bound: float
    cost: CostModel
    target_load: float = 0.0
    notes: list[str] = field(default_factory=list)
    min_answer: int = MIN_ANSWER  # how long an answer must be before its trial rounds (a named one's: 0)
    session: bool = False
    # the session's evidence, as its drafter reports it
    load_seconds: float = 0.0  # what its load took, once it loaded ...
    beside: float = 0.0  # ... and what the target's rounds lost meanwhile
    realized: Realized = field(default_factory=Realized)  # its rounds against the target alone's time
    learned: float | None = None  # the agreement its rounds showed (draft_model.Acceptance.learned)
    answers: list[int] = field(default_factory=list)  # each answer's tokens
    dropped: bool = False  # its realized rounds lost in this session: it drafts no more
    trials: int = field(init=False)  # trial rounds left (TRIAL_K tokens whatever their price, to be measured)

    def __post_init__(self) -> None:
        self.trials = TRIAL_ROUNDS if self.choice in ("try", "named") else 0

    @classmethod
    def decide(
        cls,
        draft_key: str,
        name: str,
        kept: Kept,
        cost: CostModel,
        *,
        bound: float,
        loaded_in: float,
        named: bool,
        session: bool = False,
    ) -> DraftPolicy:
        """The session's choice (see the module), and what it says to the user. Nothing is measured for it; its
        `cost` is priced at the size bound where the draft model drafts before its costs are measured."""
        decision, measured, ratio = kept.decision, kept.measured and cost.measured, bound / SIZE_MARGIN
        cost = copy.deepcopy(cost)
        if measured:
            kept.price(cost)
        may_win = not cost.measured or clear_win(
            by_size(cost, bound), margin=win_margin(cost)
        )  # a first run: its answer
        choice: Choice
        if named:
            choice = "named"
        elif not cost.measured:  # nothing to price a try against: a verdict, or an exploration in the answer
            choice = "use" if decision.uses else "explore" if decision.margin is None else "skip"
        elif not (measured or may_win):  # never worth a look: not even at its size bound
            choice = "skip"
        else:
            load = kept.load_or_estimate(cost, ratio, loaded_in)
            choice = decision.choice(try_estimate(bound, cost, load), may_win=may_win)
        notes = []
        if choice == "skip":
            why = (
                draft_ratio(cost)
                if measured
                else f"by its size a draft token costs at least {bound:.2f} target decodes"
            )
            said = cannot_win(why) if measured or not may_win else "not loaded: not tried here yet"
            notes = [f"draft model {name} {said}"]
        elif choice == "try":
            notes = [f"draft model {name} tried in this answer (its costs here are learned from its drafts)"]
        if choice == "try" or (choice != "skip" and not measured):  # priced by its size until it drafts
            cost.guess_draft(ratio)
        start = 0 if named else MIN_ANSWER
        return cls(draft_key, name, choice, kept, bound, cost, loaded_in, notes, min_answer=start, session=session)

    @property
    def preload(self) -> bool:
        """Whether its load starts at the session's first round, whatever its price (the user named it)."""
        return self.choice == "named" and not self.dropped and not self.load_seconds

    def probes(self) -> list[Drafter]:
        """The drafters measuring what its choice needs beside it: an explored one's batch probe."""
        return [BatchProbe(self)] if self.choice == "explore" else []

    # What an answer asks of it (DraftModelDrafter), in one call.

    @property
    def agreement(self) -> float:
        """Its agreement with the target's confidence to start from: what runs before learned (else 1), drawn back
        toward 1 the longer it has not drafted, so that an unlucky answer's low estimate is looked at again
        rather than kept for ever (nothing else would correct it: a draft model that never drafts learns nothing)."""
        kept = self.kept.agreement or 1.0
        return kept + (1.0 - kept) * min(self.kept.decision.runs / FORGET_RUNS, 1.0) if kept < 1 else kept

    def terms(self, cost: CostModel, *, answer: int, room: int, alpha: float) -> Terms | None:
        """What its offer may hold now, `answer` tokens into the answer with `room` left, at the acceptance
        `alpha` its drafter predicts (Terms; None once dropped).

        Its load is priced into its setup at what it costs the target (`Kept.load_price`; none once loaded, or
        for a named one: the user's choice). Not loaded yet, its setup is spread over the horizon: the rest of the
        answer as this pair's answers were long before, or at least the answer so far (ski rental: loaded once it
        would have repaid its setup on the tokens so far, so a short answer never pays for it and a long one loses
        at most that), and in a session the rest of the session likewise (its tokens as this pair's sessions
        produced, or at least those so far); one in use from the answer's first round, one explored or tried not
        before SEEN_TOKENS of the answer showed how sure
        the target is of it, nor as an exploration before this answer measured a small batch (the batch probe, a
        copy) and it then promises a clear win over that horizon; nor where its load would take as many tokens as
        the horizon holds (it drafts none while it loads: a load that would end with the answer never starts)."""
        if self.dropped:
            return None
        named, loaded = self.choice == "named", self.load_seconds > 0
        load = 0.0 if loaded or named else self.kept.load_price(cost, self.bound / SIZE_MARGIN, self.target_load)
        catch_up = 1.0 if loaded else beside_share(cost)
        if loaded or named:
            horizon = room
        elif answer < SEEN_TOKENS and self.choice != "use":  # the text (the target's confidence) is not seen yet
            horizon = 0
        else:
            horizon = self._horizon(answer, room)
            if self._loading_tokens(cost) >= horizon:  # it would be ready too late to draft any of it
                horizon = 0
            small_batch = any(2 <= n <= PROBE_ROWS for n in cost.verify)  # measured, not a guess
            win = clear_win(cost, alpha=alpha, room=horizon, margin=win_margin(cost))
            if self.choice == "explore" and not (small_batch and win):
                horizon = 0
        return Terms(load, horizon, self.trials > 0 and answer >= self.min_answer, catch_up)

    def _horizon(self, answer: int, room: int) -> int:
        """The tokens a load now would be spread over (ski rental: at least as many as came before it)."""
        if not self.session:
            return min(room, max(answer, round(self.kept.answer or 0) - answer))
        done = sum(self.answers) + answer
        return max(done, round(self.kept.session or SESSION_TOKENS) - done)

    def _loading_tokens(self, cost: CostModel) -> int:
        """The tokens the target decodes alone while the draft model loads (its load's seconds, as it last took
        or as estimated, at the target alone's speed slowed by the share of it the load takes)."""
        seconds = self.kept.load_or_estimate(cost, self.bound / SIZE_MARGIN, self.target_load)
        return math.ceil(seconds * (1 - beside_share(cost)) / cost.alone) if cost.alone > 0 else 0

    def worth_measuring(self, answer: int, room: int) -> bool:
        """Whether the horizon now is at least PROBE_HORIZON tokens: over fewer the draft model's load is repaid
        nowhere, so measuring its costs (the batch probe) could change nothing yet."""
        return self._horizon(answer, room) >= PROBE_HORIZON

    # The evidence its drafter reports.

    def loaded(self, seconds: float, beside: float) -> None:
        """Its load took `seconds`, and cost the target's rounds `beside` seconds meanwhile."""
        self.load_seconds += seconds
        self.beside += beside

    def caught_up(self, seconds: float) -> None:
        """A catch-up of its cache took `seconds` (within its rounds)."""
        self.realized.catch_up += seconds

    def drafted(self, seconds: float, alone: float, *, trial: bool) -> None:
        """One of its rounds took `seconds` where the target alone would have taken `alone` (a `trial` round:
        one less due). An explored or tried draft model whose realized rounds lose is dropped."""
        self.realized.add(seconds, alone)
        if self.choice in ("explore", "try") and self.realized.losing:
            self.dropped = True
        if trial:
            self.trials -= 1

    def answered(self, tokens: int, learned: float | None) -> None:
        """An answer ended, `tokens` long (0: none drafted for), its agreement so far `learned`."""
        if tokens:
            self.answers.append(tokens)
        self.learned = learned

    # Settling a session.

    def settle(self, cost: CostModel, seconds: float) -> Kept:
        """Fold the finished session into what is kept: the user spent `seconds` on it; its evidence says what the
        draft model's rounds took against the target alone, the agreement they showed and its answers' lengths.
        Once only."""
        kept, loaded, realized = self.kept, self.load_seconds > 0, self.realized
        for n in self.answers:
            kept.answer = n if kept.answer is None else (1 - ANSWER_DECAY) * kept.answer + ANSWER_DECAY * n
        if self.session and self.answers:
            n = sum(self.answers)
            kept.session = n if kept.session is None else (1 - ANSWER_DECAY) * kept.session + ANSWER_DECAY * n
        known = cost.draft > 0 and not cost.draft_guessed  # measured here, now or by a run before
        if known:
            kept.draft, kept.draft_prefill = cost.draft, cost.draft_prefill
        speedup = realized.speedup() if loaded else None
        promised = promise(cost) if loaded and known and cost.measured else None  # no evidence unless loaded
        lost = max(realized.seconds + self.beside - realized.alone, 0.0) if loaded else 0.0
        kept.decision.settle(
            self.choice if loaded and self.choice != "named" else "use" if loaded else "skip",
            margin=speedup if speedup is not None else promised,
            seconds=seconds,
            lost=lost,
        )
        if self.learned is not None and realized.rounds:  # evidence accumulates
            kept.agreement = self.learned if kept.agreement is None else (kept.agreement + self.learned) / 2
        if loaded:
            kept.load, kept.beside = self.load_seconds, self.beside
        return kept


def verdict(kept: Kept, cost: CostModel | None, bound: float) -> str:
    """What `localspec generate` does with the draft model here, in words (`localspec doctor`)."""
    if cost is None:
        return (
            "not decided yet: the first `localspec generate` learns the target's costs, and explores it if it may win"
        )
    decision = kept.decision
    if not kept.measured:
        if not clear_win(by_size(cost, bound), margin=win_margin(cost)):
            return cannot_win(f"by its size a draft token costs at least {bound:.2f} target decodes")
        return "not measured yet: the next answer it may clearly win loads it, beside the target's work"
    cost = copy.deepcopy(cost)
    kept.price(cost)
    if decision.uses:
        return f"used where it wins ({draft_ratio(cost)}); it loads beside the target's work where its load is repaid"
    tries = f"tried again after {max(decision.wait - decision.runs, 0)} more runs, within the budget for tries"
    return f"{cannot_win(draft_ratio(cost))}; {tries}"
