"""Measured decode costs of this machine (the planner's input): a verify curve, the draft's cost, the host's.

A round that drafts k tokens costs k draft steps plus one target decode of k + 1 tokens, plus the host's time
outside llama_decode (a fixed part, and a part per position it samples), and yields 1 + S_1 + ... + S_k tokens
on average, where S_j is the probability that the first j drafts are accepted. best_k picks the k with the most
tokens per second, k = 0 (the target alone) included.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.core.meter import Times

QUIET = 1.15  # a session whose speed is within this factor of the quiet curve may teach the curve a slowdown
_FLOOR_BATCH = 64  # the batch size whose per-token cost bounds a prefill's
CATCH_UP = 16  # the fewest tokens of a draft model's catch-up whose time per token is taken for its batched cost
PROBE_ROWS = 4  # the batch whose cost against one decode says how compute-bound decodes are here (probe.BatchProbe)
# How much dearer than its size's share a draft token is per unit of the machine's compute-bound share (a smaller
# model uses the cores less well): fitted to measured draft tokens, docs/benchmarks.md, "The draft model's prior".
COMPUTE_PENALTY = 1.6


@dataclass
class CostModel:
    """Seconds of one target decode of n tokens (interpolated between measured n) and of one draft token.

    `verify`, `draft` and `draft_prefill` are this hardware's quiet costs, the ones kept between runs;
    `scale` is how much slower the machine runs now (load, thermals). Decisions use both, so the whole
    curve and the draft follow a machine that got slower, and the draft never looks cheap only because
    it last ran when the machine was idle. Load only adds time, so what is kept learns from what it
    sees asymmetrically: a decode faster than the kept cost is the hardware's truth and is learned at
    once; a slower one only slowly, and only in a session that runs near the quiet speed: a busy hour
    is forgotten, not learned as the hardware's curve. `bound()` keeps the physics: costs grow with
    the batch, and a draft's batched catch-up costs per token at least half of what the target's own
    batching would predict.
    """

    verify: dict[int, float]
    draft: float = 0.0  # seconds of one draft token, quiet
    draft_prefill: float = 0.0  # seconds per token of a draft-model prefill (catching up), quiet
    ema: float = 0.3  # weight of a new measurement in the scale (the machine's speed now) ...
    shape_ema: float = 0.05  # ... and in a quiet slowdown of the kept costs (steady hardware: learned slowly)
    scale: float = 1.0
    prefill: float = 0.0  # seconds per token of the largest prefill this session (logits at one row): 0, none yet
    _prefill_n: int = field(default=0, repr=False)
    # a draft model not measured yet (or on a fresh trial) is priced by its file's size against the target's (this
    # share) until its first decodes replace the guess (`draft_token`); 0: its costs are measured
    draft_guess: float = 0.0
    # the host's seconds outside llama_decode (sampling, the planner, drafters' bookkeeping): fixed per round, per
    # sampled position, and per draft-model token (its sampling; 0: not measured yet, priced as a position)
    host_round: float = 0.0
    host_position: float = 0.0
    host_draft: float = 0.0
    # a draft model loading beside the target (draft_model.BackgroundLoad): the decodes and host time measured
    # meanwhile are the load's slowdown, which the draft's policy prices, not the machine's: nothing is learned
    beside_load: bool = field(default=False, repr=False)
    _ns: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._ns = sorted(self.verify)
        self.bound()

    @property
    def draft_guessed(self) -> bool:
        return self.draft_guess > 0

    @property
    def draft_token(self) -> float:
        """Estimated seconds of one draft token now. A guessed one costs its size's share of a target decode
        where decodes are memory-bound (a decode reads every weight once), and more the more compute-bound the
        target's batches show the machine to be (a smaller model uses the cores less well): COMPUTE_PENALTY
        times the compute-bound share of a decode, the extra cost of a batch row over a whole decode."""
        if not self.draft_guessed:
            return self.scale * self.draft
        return self.draft_guess * (1 + COMPUTE_PENALTY * self.compute_share()) * self.verify_cost(1)

    def compute_share(self) -> float:
        """How compute-bound the target's decodes are here, 0-1: what a batch row adds, over a whole decode (0:
        a batch costs one decode, as on a GPU; 1: each row costs a decode, as on a CPU with a small model). A
        first step that stays flat after (the Metal backend's dearer 2-row shape) is no compute: where 2 rows
        are measured, the rows after them count."""
        top, one = self._shape(PROBE_ROWS), self._shape(1)
        added = (top - one) / (PROBE_ROWS - 1)
        if 2 in self.verify:
            added = min(added, (top - self.verify[2]) / (PROBE_ROWS - 2))
        return min(max(added / one, 0.0), 1.0)

    @property
    def draft_prefill_token(self) -> float:
        """Estimated seconds per token of a draft-model catch-up (a batched prefill) now: a guessed draft's
        batches save what the target's own do."""
        if self.draft_guessed:
            return self.draft_token * min(self._batch_saving(), 1.0)
        return self.scale * (self.draft_prefill or self.draft)

    def _batch_saving(self) -> float:
        """What a token of a large batch (a prefill's) costs against a one-token decode of the target."""
        return self._shape(_FLOOR_BATCH) / _FLOOR_BATCH / self._shape(1)

    @property
    def quiet(self) -> bool:
        """Whether the machine runs near its quiet speed now."""
        return self.scale <= QUIET

    def verify_cost(self, n: int) -> float:
        """Estimated seconds for a target decode of n tokens, logits at all n."""
        return self.scale * self._shape(n)

    def round_cost(self, k: int, expected: float) -> float:
        """Estimated seconds of a round that verifies k draft tokens and emits `expected` tokens, the host's time
        included (its draft tokens' own cost apart: the drafter's token_seconds)."""
        return self.verify_cost(k + 1) + self.host_round + self.host_position * expected

    def quiet_round(self, k: int, expected: float) -> float:
        """round_cost on the quiet curve: what the round takes where nothing else slows the machine."""
        return self._shape(k + 1) + self.host_round + self.host_position * expected

    @property
    def alone(self) -> float:
        """Estimated seconds per token of the target alone (a one-token decode and the host's round)."""
        return self.round_cost(0, 1.0)

    @property
    def draft_step(self) -> float:
        """Estimated seconds per draft-model token: its decode, and the host's sampling of it (as measured, else
        as a target position's)."""
        return self.draft_token + (self.host_draft or self.host_position)

    def observe_host(self, fixed: float, sampled: float, positions: int) -> None:
        """Fold a round's host seconds into the kept ones: `fixed` outside the decodes, sampling and drafting, and
        `sampled` over `positions` sampled positions (none: it is the round's). A measurement counts as at most
        four times the estimate (a garbage collection, a busy moment)."""
        if self.beside_load:
            return
        if not positions:
            fixed, sampled = fixed + sampled, 0.0
        self.host_round = _host_learned(self.host_round, fixed)
        if positions:
            self.host_position = _host_learned(self.host_position, sampled / positions)

    def learn(self, times: Times) -> None:
        """Fold one round's record into the kept costs, the one place a round writes them: the draft model's
        tokens and catch-ups (decodes in the draft span), the host's time of a draft token, the target's batch
        (where every row had logits: fewer rows cost less, not the curve), and the host's time of the round."""
        for n, seconds in times.decodes["draft"]:
            if n == 1:
                self.observe_draft(seconds)
            elif n >= CATCH_UP:
                self.observe_draft_prefill(seconds / n)
        if times.decodes["draft"] and times.drafted:
            self.observe_host_draft(times.draft_host / times.drafted)
        if times.rows and times.whole:
            self.observe_verify(times.rows, times.spans["verify"])
        self.observe_host(times.host, times.spans["sample"], times.positions)

    def observe_host_draft(self, seconds_per_token: float) -> None:
        """Fold a draft-model token's host seconds (sampling it, keeping its cache) into the kept one."""
        self.host_draft = _host_learned(self.host_draft, seconds_per_token)

    def curve(self) -> dict[int, float]:
        """The quiet cost at every measured size (what is kept for the next run)."""
        return {n: self.verify[n] for n in self._ns}

    @property
    def measured(self) -> bool:
        """Whether any decode has been measured yet (a first run learns its curve from its own rounds)."""
        return bool(self.verify)

    def _shape(self, n: int) -> float:
        ns, v = self._ns, self.verify
        if n in v:
            return v[n]
        i = bisect.bisect_left(ns, n)
        if i == 0:
            return v[ns[0]] * n / ns[0]
        if i == len(ns):  # beyond the largest measured batch: a guess its first use corrects
            b = ns[-1]
            return v[b] + (n - b) * self._slope()
        a, b = ns[i - 1], ns[i]
        return v[a] + (v[b] - v[a]) * (n - a) / (b - a)

    def _slope(self) -> float:
        """The seconds an extra token adds to a batch beyond the largest measured: the last measured slope (or,
        where one size is all that is known, half the per-token cost), at least half the largest batch's per-token
        cost, and at most twice a prefill's per token where one was seen: llama.cpp switches to its batched
        kernels as batches grow, so a steep slope among small batches says little of large ones, and a guess
        too dear would never be tried, so never corrected (each size's first use measures it)."""
        ns, v = self._ns, self.verify
        b = ns[-1]
        slope = max((v[b] - v[ns[-2]]) / (b - ns[-2]), v[b] / b * 0.5) if len(ns) > 1 else v[b] / b * 0.5
        return min(slope, 2 * self.prefill) if self.prefill else slope

    def observe_prefill(self, n: int, seconds: float) -> None:
        """Note a prefill of n tokens: what a batch costs per token where the curve knows one size only."""
        if n >= self._prefill_n:
            self.prefill, self._prefill_n = seconds / n, n

    def _learned(self, kept: float, seconds: float, weight: float) -> float:
        """A kept quiet cost after one measurement: down at once toward a faster one, up slowly when quiet."""
        if seconds < kept:
            return kept + 0.5 * (seconds - kept)
        return kept * (1 + weight * (min(seconds / kept, 2.0) - 1)) if self.quiet else kept

    def observe_verify(self, n: int, seconds: float) -> None:
        """Fold a measured decode into the scale (the speed now) and the kept quiet cost of its size.

        One measurement counts as at most twice the estimate (a decode stalled by a burst of load); a new
        size between measured ones starts halfway between the interpolated and the measured cost; one beyond
        the largest measured (where the estimate is a guess) is taken as measured, and leaves the scale alone.
        Nothing is learned beside a draft model's load (`beside_load`), but a first decode.
        """
        if self.beside_load and self.verify:
            return
        if not self.verify:  # the first decode measured
            self.verify[n], self._ns = seconds, [n]
            return
        if n < self._ns[-1] or n in self.verify:  # measured or between measured sizes: the difference is the
            ratio = min(max(seconds / self.verify_cost(n), 0.5), 2.0)  # machine's speed now (beyond: the guess's)
            self.scale = max(self.scale * ratio**self.ema, 1.0)  # never faster than quiet: that is the curve's
        if n > self._ns[-1]:
            self.verify[n] = seconds / self.scale
        else:
            self.verify[n] = self._learned(self._shape(n), seconds, self.shape_ema if n in self.verify else 0.5)
        if len(self._ns) != len(self.verify):
            self._ns = sorted(self.verify)
        self.bound()

    def guess_draft(self, size_ratio: float) -> None:
        """Price a draft model not measured yet (or on a fresh trial) by its file's size against the target's
        (`draft_token`), a guess its first decodes replace."""
        self.draft, self.draft_prefill, self.draft_guess = 0.0, 0.0, size_ratio

    def observe_draft(self, seconds_per_token: float) -> None:
        """Fold a measured draft token into its kept quiet cost (compared as measured; the first one after a
        guess replaces it, divided by the machine's slowdown now)."""
        if self.draft_guessed or not self.draft:
            self.draft, self.draft_guess = seconds_per_token / self.scale, 0.0
        else:
            self.draft = self._learned(self.draft, seconds_per_token, self.shape_ema)
        self.bound()

    def observe_draft_prefill(self, seconds_per_token: float) -> None:
        """Fold a measured catch-up of the draft model (a batch, seconds per token) into its kept cost."""
        if self.draft_guessed or not self.draft_prefill:
            self.draft_prefill = seconds_per_token / self.scale
        else:
            self.draft_prefill = self._learned(self.draft_prefill, seconds_per_token, 0.5)
        self.bound()

    def bound(self) -> None:
        """Make the kept costs physical: a decode of more tokens costs no less (per token it need not fall:
        llama.cpp switches kernels with the batch size); a draft's catch-up costs per token at least half the
        draft token times the target's own batch saving."""
        last = 0.0
        for n in self._ns:
            self.verify[n] = last = max(self.verify[n], last)
        if self.draft and self.verify:
            self.draft_prefill = max(self.draft_prefill or self.draft, 0.5 * self.draft * self._batch_saving())


HOST_EMA = 0.05  # weight of a round's host seconds in the kept ones (hundreds of rounds an answer: a steady figure)


def _host_learned(kept: float, seconds: float) -> float:
    """A kept host figure after one measurement (a difference of clocks: never below 0, at most four times it)."""
    seconds = max(seconds, 0.0)
    if kept <= 0:
        return seconds
    return kept + HOST_EMA * (min(seconds, 4 * kept) - kept)


def best_k(survival: Sequence[float], cost: CostModel, draft_cost: float) -> tuple[int, float]:
    """(k, tokens per second) maximizing (1 + S_1 + ... + S_k) / (k * draft_cost + round_cost(k)), the host's
    time included in both (k = 0: the target alone)."""
    best, best_rate, expected = 0, 1.0 / cost.alone, 1.0
    for k, s in enumerate(survival, 1):
        expected += s
        rate = expected / (k * draft_cost + cost.round_cost(k, expected))
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate


def amortized(rate: float, setup: float, horizon: int) -> float:
    """Tokens per second over the next `horizon` tokens when `setup` seconds are paid once first."""
    if horizon <= 0:
        return 0.0
    return rate if setup <= 0 else horizon / (horizon / rate + setup)
