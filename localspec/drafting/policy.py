"""The draft-model policy, whole: a prior, evidence, a choice, bounded regret.

Whether a draft model drafts here, and when, is decided here and nowhere else:

- **What is kept** per target × draft model (`Kept`, in the cost store beside the target's curve): its measured
  costs, its agreement with the target, its load's seconds, and its verdict (`DraftDecision`).
- **The prior** (`promise`): what a draft model may gain before it has drafted here: a draft token at its size
  bound (`size_bound`), an acceptance of its agreement (kept, else 1) times the target's confidence in this
  answer, against the target's curve as this answer measures it.
- **Each session's choice** (`DraftPolicy.decide`): `named` (the user chose it: it drafts from its first
  answer), `use` (its verdict), `explore` (never measured here and the prior may promise a clear win: it is
  loaded in this answer where the promise is clear), `try` (a measured loser or a borderline promise, tried
  rarely, within BUDGET of the user's seconds), or `skip`.
- **Within an answer** (`DraftPolicy` as DraftModelDrafter asks it): it loads beside the target's work, so its
  load is priced at what it costs the target meanwhile (`load_price`: as measured here, else by the share of the
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
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal, NamedTuple

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer, Verdict
from localspec.drafting.costs import PROBE_ROWS, CostModel, amortized, best_k

ASSUMED_ALPHA = 0.9  # the acceptance a draft model is judged at where nothing says what the text is like
# How much faster than the target alone a draft model must promise to be loaded before it has drafted here (a
# clear win): the prior's costs are bounds and guesses, a one-token cost measured just after a load reads high,
# and its rounds cost Python time the curve leaves out (docs/benchmarks.md, "The draft model's policy").
WIN_MARGIN = 1.25
# A clear win's margin where decodes are memory-bound (a GPU): there the prior's draft token (its size's share of a
# decode) is what one costs, and a load beside the target costs it little; it rises to WIN_MARGIN as decodes turn
# compute-bound (CostModel.compute_share up to CPU_SHARE), where the prior errs high.
MEMORY_BOUND_MARGIN = 1.1
DRAFT_MAX_K = 16  # the longest draft a draft model makes
# A draft model on trial (a try, or one the user named) drafts TRIAL_K tokens in this many rounds where nothing
# else drafts, whatever its price (a guess until then), so that its costs and acceptance are measured.
TRIAL_ROUNDS, TRIAL_K = 4, 4
MIN_ANSWER = 32  # a try's trial waits for an answer this long: a shorter one would not repay its load
# The batch probe waits for a horizon this long (twice SEEN_TOKENS): most short answers end before it, and what it
# measures could not repay a load over fewer tokens on any machine simulated (docs/benchmarks.md).
PROBE_HORIZON = 16
JUDGED_ROUNDS = 8  # its own rounds after which the realized speedup judges a draft model (fewer: its costs do)
# An explored or tried draft model whose judged rounds realize less than this share of the target alone's speed is
# dropped within the answer: below 1 by the spread of eight rounds' acceptance (a draft whose rounds win 1.25x at an
# acceptance of 0.6 realizes less than 0.9 in about one answer in twenty).
DROP_SPEEDUP = 0.9
SIZE_MARGIN = 0.75  # a draft token costs at least this share of its file size against the target's, in decodes
FORGET_RUNS = 16  # runs without drafting after which a kept agreement below 1 is back at 1 (see agreement)
SEEN_TOKENS = 8  # answer tokens whose confidence is seen before a draft model not loaded yet may be
ANSWER_DECAY = 0.3  # the weight of a new answer's length in the pair's typical length
# From a compute-bound share of a decode of CPU_SHARE on, a draft model's first load is priced at CPU_LOAD times the
# target's: loaded in the middle of an answer on a CPU it competes with the target's threads (docs/benchmarks.md,
# "The draft model's prior").
CPU_SHARE, CPU_LOAD = 0.25, 2.0
MEMORY_SHARE = 0.1  # up to this compute-bound share decodes are memory-bound: a load costs its file's share
# The share of the target's speed a draft model's load beside it takes, before one was measured here: an upload on
# a GPU (memory-bound decodes) little of it, a load on the CPU cores the target decodes on about half of it.
BESIDE_GPU, BESIDE_CPU = 0.1, 0.5
# The tokens a session (a chat, a server) produces in all, before this pair's sessions were measured: a handful of
# answers; what its sessions produced (a decayed mean) replaces it.
SESSION_TOKENS = 1500
# The verdict's noise band: a verdict flips only beyond 1 +- NOISE, over twice the range of repeated tries' margins
# (docs/benchmarks.md, "The verdict's noise band").
NOISE = 0.07
BUDGET = 0.03  # the most of the user's seconds on a pair that its explorations and tries may cost
FIRST_WAIT = 1  # runs without the draft model before its first try
MAX_WAIT = 64  # the longest wait between tries (the machine may change: a busy hour ends, a driver improves)

Choice = Literal["named", "use", "explore", "try", "skip"]


@dataclass
class DraftDecision:
    """The kept verdict of one target on one draft model, with its exploration budget (see the module)."""

    uses: bool = False  # the verdict: the draft model drafts in every run
    margin: float | None = None  # the learned margin at the last settle (None: never measured here)
    runs: int = 0  # runs since the draft model was last loaded
    wait: int = FIRST_WAIT  # runs without it before it is tried again
    user_seconds: float = 0.0  # the user's seconds on this pair, all runs
    try_seconds: float = 0.0  # of which explorations, tries and ended uses lost at most this
    last_try: float | None = None  # what the last try cost: the next one's estimate

    @classmethod
    def from_json(cls, data: Any) -> DraftDecision:
        """The kept decision; a missing or damaged one starts afresh (as on a new machine)."""
        if not isinstance(data, dict):
            return cls()
        kept: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name)
            ok = isinstance(value, bool) if f.name == "uses" else _count(value, whole=f.name in ("runs", "wait"))
            if ok:
                kept[f.name] = value
        return cls(**kept)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def choice(self, estimate: float, *, may_win: bool = True) -> Choice:
        """This run's: use the draft model, explore it (never measured here, and `may_win` by its prior), try it
        (a rare exploration within the budget), or skip it. `estimate` is what a try would cost, in seconds,
        before one was measured; a try starts only where the budget would hold at twice that."""
        if self.uses:
            return "use"
        if self.margin is None and may_win:
            return "explore"
        cost = self.last_try if self.last_try is not None else estimate
        if self.runs >= self.wait and self.try_seconds + 2 * cost <= BUDGET * self.user_seconds:
            return "try"
        return "skip"

    def settle(self, choice: Choice, *, margin: float | None, seconds: float, lost: float = 0.0) -> None:
        """Fold in a finished run: its choice ("skip" where the draft model never loaded), its margin (the
        realized speedup, or the promise of its measured costs; None where unknown), the user's `seconds`, and
        what the draft model `lost` against the target alone (its load and its rounds).

        An exploration or a try that keeps it out, like a use that ends, doubles the wait before the next try,
        so a draft model near the threshold is explored ever more rarely, within the budget."""
        self.user_seconds += seconds
        self.runs = 0 if choice != "skip" else self.runs + 1
        explored = choice in ("explore", "try")
        if explored:
            self.try_seconds += lost
            self.last_try = lost
        if margin is not None:  # evidence accumulates: one answer's luck moves the margin halfway
            margin = self.margin = margin if self.margin is None else (self.margin + margin) / 2
            if self.uses and margin < 1 - NOISE:
                self.uses, self.try_seconds = False, self.try_seconds + lost
                self.wait = min(2 * max(self.wait, FIRST_WAIT), MAX_WAIT)
            elif not self.uses and margin > 1 + NOISE:
                self.uses = True
        if explored and not self.uses:
            self.wait = min(2 * max(self.wait, FIRST_WAIT), MAX_WAIT)


@dataclass
class Kept:
    """What is kept of one draft model next to one target: its quiet costs (None: never measured here), its
    agreement with the target's confidence (draft_model.Acceptance), its load's seconds, and its verdict."""

    decision: DraftDecision = field(default_factory=DraftDecision)
    draft: float | None = None
    draft_prefill: float | None = None
    agreement: float | None = None
    load: float | None = None
    beside: float | None = None  # what its load beside the target cost the target, in seconds
    answer: float | None = None  # how long this pair's answers are, in tokens (a decayed mean)
    session: float | None = None  # how many tokens this pair's sessions (chats, servers) produce (a decayed mean)

    TABLES: ClassVar[tuple[str, ...]] = ("draft", "draft_prefill", "agreement", "load", "beside", "answer", "session")
    STORED: ClassVar[dict[str, str]] = {
        "load": "draft_load",
        "beside": "draft_load_beside",
        "answer": "answer_tokens",
        "session": "session_tokens",
    }  # a table's name in the store where it differs

    @classmethod
    def from_entry(cls, entry: dict[str, Any], draft_key: str) -> Kept:
        """What a target's entry in the cost store keeps of `draft_key` (a damaged value: not kept)."""
        decisions = entry.get("decisions")
        kept = cls(DraftDecision.from_json(decisions.get(draft_key) if isinstance(decisions, dict) else None))
        for name in cls.TABLES:
            setattr(kept, name, positive(entry.get(cls.STORED.get(name, name)), draft_key))
        return kept

    def into(self, entry: dict[str, Any], draft_key: str) -> None:
        """Write what is known into a target's entry of the cost store (a table of the wrong shape starts afresh)."""
        values: dict[str, Any] = {"decisions": self.decision.to_json()}
        values |= {self.STORED.get(n, n): getattr(self, n) for n in self.TABLES if getattr(self, n) is not None}
        for table, value in values.items():
            if not isinstance(entry.get(table), dict):
                entry[table] = {}
            entry[table][draft_key] = value

    @property
    def measured(self) -> bool:
        return self.draft is not None

    def price(self, cost: CostModel) -> None:
        """Give `cost` the draft model's kept costs (measured: `measured`)."""
        cost.draft, cost.draft_prefill = self.draft or 0.0, self.draft_prefill or 0.0
        cost.bound()

    def load_or_estimate(self, cost: CostModel, size_ratio: float, loaded_in: float) -> float:
        """What its load takes here: as it last took, else as `load_estimate` expects."""
        return self.load if self.load is not None else load_estimate(cost, size_ratio, loaded_in)

    def load_price(self, cost: CostModel, size_ratio: float, loaded_in: float) -> float:
        """What its load beside the target costs the target: as measured when it last loaded, else its load's
        seconds times the share of the target's speed such a load takes here (`beside_share`)."""
        if self.beside is not None:
            return self.beside
        return self.load_or_estimate(cost, size_ratio, loaded_in) * beside_share(cost)


def positive(table: Any, key: str) -> float | None:
    """table[key] where it is a positive finite number (a kept time or ratio); None otherwise."""
    value = table.get(key) if isinstance(table, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    return None


def size_bound(target_bytes: int, draft_bytes: int) -> float:
    """A draft token's least cost in target decodes, by file size: a decode reads every weight once, and a
    smaller model uses the machine about as well per byte (hence SIZE_MARGIN)."""
    return SIZE_MARGIN * draft_bytes / target_bytes


def by_size(cost: CostModel, bound: float) -> CostModel:
    """The best a draft model not measured yet may cost here: a draft token at its size bound (`bound`, in
    target decodes), and batches larger than any measured no dearer than the largest measured."""
    curve = cost.curve()
    curve.setdefault(64, max(curve.values()))
    return CostModel(
        curve,
        draft=bound * cost.verify_cost(1),
        host_round=cost.host_round,
        host_position=cost.host_position,
        host_draft=cost.host_draft,
    )


def promise(
    cost: CostModel, *, alpha: float = ASSUMED_ALPHA, room: int = 16, setup: float = 0.0, margin: float = WIN_MARGIN
) -> float:
    """A draft model's promised speedup over the target alone at acceptance `alpha` (amortizing `setup` seconds
    over `room` tokens), over `margin`: above 1 it promises a clear win; 0 where no k wins at all."""
    survival = [alpha**j for j in range(1, min(room, DRAFT_MAX_K) + 1)]
    k, rate = best_k(survival, cost, cost.draft_step)
    return amortized(rate, setup, room) * cost.alone / margin if k else 0.0


def clear_win(cost: CostModel, **at: Any) -> bool:
    """Whether a draft model with these costs promises to beat the target alone by WIN_MARGIN (or the `margin`
    given: `promise`). On a CPU, where a batch of k tokens costs nearly k single decodes, it never does with a
    Q4_K target."""
    return promise(cost, **at) > 1


def load_estimate(cost: CostModel, size_ratio: float, loaded_in: float) -> float:
    """What a draft model's first load here may take, the target's having taken `loaded_in`: its file's share of
    that where decodes are memory-bound (a load is a copy), up to CPU_LOAD times it as they are compute-bound (a
    load in the middle of an answer, beside the target on a CPU, is slower than on its own: `compute_bound`)."""
    if not cost.measured:
        return CPU_LOAD * loaded_in
    return loaded_in * (size_ratio + (CPU_LOAD - size_ratio) * compute_bound(cost, above=MEMORY_SHARE))


def compute_bound(cost: CostModel, *, above: float = 0.0) -> float:
    """How compute-bound decodes are here, 0-1: 0 up to a compute-bound share of `above`, 1 from CPU_SHARE on (a
    CPU whose cores a load beside the target competes for), linear between; 1 before any decode was measured."""
    if not cost.measured:
        return 1.0
    return min(max((cost.compute_share() - above) / (CPU_SHARE - above), 0.0), 1.0)


def beside_share(cost: CostModel) -> float:
    """The share of the target's speed a draft model's load beside it takes, before one was measured: BESIDE_GPU
    where decodes are memory-bound, up to BESIDE_CPU as they are compute-bound (its load then shares the cores)."""
    return BESIDE_GPU + (BESIDE_CPU - BESIDE_GPU) * compute_bound(cost)


def win_margin(cost: CostModel) -> float:
    """The promise a draft model not measured here must make to be explored: MEMORY_BOUND_MARGIN where decodes
    are memory-bound, up to WIN_MARGIN as they are compute-bound (where the prior errs high)."""
    return MEMORY_BOUND_MARGIN + (WIN_MARGIN - MEMORY_BOUND_MARGIN) * compute_bound(cost)


def try_estimate(bound: float, cost: CostModel, load: float) -> float:
    """What a first try of a draft model may cost here: its `load` (kept, else at most the target's) and its
    trial rounds, each TRIAL_K draft tokens (`bound` target decodes each) and a larger batch than the target
    alone's (priced by the curve, guessed high where not measured)."""
    one = cost.verify_cost(1)
    return load + TRIAL_ROUNDS * (TRIAL_K * bound * one + cost.verify_cost(TRIAL_K + 1) - one)


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


class BatchProbe(Drafter):
    """What a small batch costs here, measured once before a draft model is explored for it, where the horizon
    could repay a load (`DraftPolicy.worth_measuring`: in a short answer nothing it measures could matter).

    Whether a draft model can win turns on what verifying a few tokens at once costs against one: on a GPU about
    the same, on a CPU nearly as much as decoding them one by one, and a prefill (hundreds of tokens, logits at one
    row) says little of it. Where the kept curve does not know them, it probes: it proposes the last token again
    so that a batch of 2 rows and one of PROBE_ROWS are verified, once each. The target keeps a guessed token only
    where it is the target's own, so the text is unchanged, and the batches' times teach the curve (about one extra
    decode, once per machine) and tell a compute-bound machine from the Metal backend's dearer 2-row shape
    (CostModel.compute_share)."""

    name = "batch_probe"

    def __init__(self, policy: DraftPolicy) -> None:
        self.policy = policy
        self.done: set[int] = set()  # the batch sizes it measured
        self._answer_start, self._offered = 0, 1

    def begin(self, prompt_len: int, *, fill: bool = False) -> None:
        self._answer_start = prompt_len

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        self._offered = self._rows(ctx, room, cost)
        return Offer(probe=self._offered - 1)

    def _rows(self, ctx: list[int], room: int, cost: CostModel | None) -> int:
        """The batch to measure now (1: none)."""
        wanted = cost is not None and self.policy.choice == "explore" and not self.policy.dropped and 1 in cost.verify
        answer = len(ctx) - self._answer_start
        # after the answer's first tokens: the first decodes after a load run slow, and the text is seen by then
        if not wanted or room < PROBE_ROWS - 1 or answer < SEEN_TOKENS:
            return 1
        assert cost is not None
        if not self.policy.worth_measuring(answer, room):  # nothing it measures could matter yet
            return 1
        # the smaller first: each is then beyond the largest measured, taken as is
        return next((n for n in (2, PROBE_ROWS) if n not in cost.verify and n not in self.done), 1)

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        return ctx[-1:] * k

    def accept(self, ctx: list[int], verdict: Verdict) -> None:
        if verdict.by is self:  # measured, or cut by a grammar: asked once either way
            self.done.add(self._offered)


def draft_ratio(cost: CostModel) -> str:
    return f"a draft token costs {cost.draft_token / cost.verify_cost(1):.2f} target decodes"


def cannot_win(why: str) -> str:
    """What is said of a draft model left out because it cannot win here."""
    return (
        f"not loaded: here it cannot beat the target alone by {WIN_MARGIN:.2f}x even at {ASSUMED_ALPHA:.0%} "
        f"acceptance ({why})"
    )


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


def _count(value: Any, *, whole: bool) -> bool:
    """Whether a kept value is a non-negative finite number (an int where `whole`)."""
    kinds = (int,) if whole else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and 0 <= value < float("inf")
