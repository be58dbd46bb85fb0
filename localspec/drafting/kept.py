"""What is kept of a draft model per target (in the cost store beside the target's curve): its measured costs, its
agreement with the target, its load's seconds, and its verdict with the budget of its tries (`DraftDecision`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal

from localspec.drafting.costs import CostModel
from localspec.drafting.prior import beside_share, load_estimate

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


def _count(value: Any, *, whole: bool) -> bool:
    """Whether a kept value is a non-negative finite number (an int where `whole`)."""
    kinds = (int,) if whole else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and 0 <= value < float("inf")
