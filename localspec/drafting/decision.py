"""Whether a run loads the draft model: a verdict kept between runs, with hysteresis and an exploration budget.

The verdict moves only when the learned margin (1.0 at the threshold: the speedup an answer realized with the
draft model, or before enough of its rounds ran, how far its promise at PROBE_ALPHA clears WIN_MARGIN) leaves
a noise band around 1; a draft model kept out is tried again only rarely (after `wait` runs without it, the
wait doubling with every try that confirms the loss and every use that ends) and only while the seconds such
tries (and ended uses) cost stay under BUDGET of the seconds the user has spent on this pair. A try is no
separate measurement: the draft model drafts for that run's answer, and its costs are learned from its own
decodes. Pure bookkeeping: calibration.py keeps it in the cost store and feeds it the figures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

# The margin's run-to-run noise, measured: eight tries of the draft model with a Q8_0 target on a 2-core Intel
# Xeon, each in a fresh process (scripts/margin_noise.py, kept in scripts/margin-trace.json), gave margins
# 1.105-1.136 (sd 0.010, range 0.031). A verdict flips only beyond 1 +- NOISE: over twice that range.
NOISE = 0.07
BUDGET = 0.03  # the most of the user's seconds on a pair that tries of its draft model may cost
FIRST_WAIT = 1  # runs without the draft model before its first try (the first run learns the target's costs)
MAX_WAIT = 64  # the longest wait between tries (the machine may change: a busy hour ends, a driver improves)

Choice = Literal["use", "try", "skip"]


@dataclass
class DraftDecision:
    """The kept state of one target's decision on one draft model (see the module's docstring)."""

    uses: bool = False  # the verdict: the draft model is loaded for every run
    margin: float | None = None  # the learned margin at the last settle (None: its costs never measured)
    runs: int = 0  # runs since the draft model was last loaded
    wait: int = FIRST_WAIT  # runs without it before it is tried again
    user_seconds: float = 0.0  # the user's seconds on this pair, all runs
    try_seconds: float = 0.0  # of which tries of a draft model that was kept out cost at most this
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

    def choice(self, estimate: float) -> Choice:
        """This run's: use the draft model, try it (a rare exploration, within the budget), or skip it.

        `estimate` is what a try would cost, in seconds, when no try has been measured yet. A try starts only
        where the budget would hold even if it cost twice that (or twice what the last try cost)."""
        if self.uses:
            return "use"
        cost = self.last_try if self.last_try is not None else estimate
        if self.runs >= self.wait and self.try_seconds + 2 * cost <= BUDGET * self.user_seconds:
            return "try"
        return "skip"

    def settle(self, choice: Choice, *, margin: float | None, seconds: float, try_seconds: float = 0.0) -> None:
        """Fold in a finished run: its choice, its margin (the answer's realized speedup with the draft model, or
        where too few of its rounds ran, the promise its costs give; None where they are unknown), the user's
        seconds, and what the draft model cost beyond the target alone (its load and its drafting): a try's, or
        a use's that ends the use.

        A use that ends, like a try that keeps it out, doubles the wait before the next try, so a draft model
        near the threshold is explored ever more rarely, within the budget."""
        self.user_seconds += seconds
        self.runs = 0 if choice != "skip" else self.runs + 1
        if choice == "try":
            self.try_seconds += try_seconds
            self.last_try = try_seconds
        if margin is not None:
            self.margin = margin
            if self.uses and margin < 1 - NOISE:
                self.uses, self.try_seconds = False, self.try_seconds + try_seconds
                self.wait = min(2 * max(self.wait, FIRST_WAIT), MAX_WAIT)
            elif not self.uses and margin > 1 + NOISE:
                self.uses = True
        if choice == "try" and not self.uses:
            self.wait = min(2 * max(self.wait, FIRST_WAIT), MAX_WAIT)


def _count(value: Any, *, whole: bool) -> bool:
    """Whether a kept value is a non-negative finite number (an int where `whole`)."""
    kinds = (int,) if whole else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and 0 <= value < float("inf")
