"""The draft-model policy simulated on machines this one is not: no model, the real policy, planner and drafter.

    python scripts/simulate.py                    # every profile x text x history, 100 runs each: one table
    python scripts/simulate.py --runs 30 --profiles gpu,laptop --json out.json

Each simulated run is a whole `localspec generate` process (or a `localspec chat` session): the target's load,
its prefill, then the speculative loop of localspec.decoding.engine, round by round, with the real Planner,
DraftModelDrafter and DraftPolicy, whose costs and verdict are kept from run to run as the cost store keeps
them. What is simulated is the machine and the text: a target decode of n rows costs the profile's curve, a
draft token and its catch-up the profile's share of a target decode, a load its seconds; each draft token
holds with the text's acceptance alpha (the target's confidence: alpha, its agreement with the draft: 1),
drawn with a fixed seed. The default's draft model loads beside the target's work as the real one does (on the
simulated clock: ready its load's seconds after it starts, the target's decodes meanwhile slowed by the profile's
`beside` share), and a chat is a session (its load priced over the session). The same runs are timed with the
target alone and with the draft model at each fixed k (loaded at its first draft, its load paid on the answer's
path), so each run's default is compared with both.

Cost profiles (target decodes are the unit): a 7B target on a consumer GPU (a flat curve to 16 rows), a 3B on
an Apple laptop (a 2-row decode dearer than a 1-row one: the Metal shape cliff of llama.cpp#4624), the 1.5B
Q4_K_M on a compute-bound 2-core AMD EPYC (scripts/cost-trace.json), and the 1.5B Q8_0 on a 2-core Intel Xeon
(a user's kept costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from localspec.core import meter
from localspec.core.meter import Meter
from localspec.core.sampling import InvariantSampling, PAt, SamplerSettings
from localspec.decoding.planner import Planner
from localspec.decoding.round import Round
from localspec.drafting import draft_model
from localspec.drafting.base import Drafter
from localspec.drafting.costs import CostModel
from localspec.drafting.draft_model import DraftModelDrafter
from localspec.drafting.kept import Kept
from localspec.drafting.policy import DraftPolicy

GREEDY = SamplerSettings(temperature=0)
# The host's seconds outside llama_decode at the default sampler, as the loop learns them on a 2-core AMD EPYC with
# its caches warm, as a GPU's host has them (`python scripts/host_time.py --replay --cases k4`): a round (the
# planner, the drafters' bookkeeping, the target's confidence), a sampled position, a draft-model token. Every
# profile is priced with these; a faster CPU spends less.
HOST_ROUND, HOST_POSITION, HOST_DRAFT = 0.00024, 0.0003, 0.00026


@dataclass(frozen=True)
class Profile:
    """A machine and a pair: a target decode of n rows costs `curve[n]` one-token decodes (interpolated; each
    row beyond the last adds the last step), one-token decode `t1` seconds; a draft token `draft` of those, a
    draft's catch-up `draft_prefill` per token; the target's prefill `prefill` per token; loads in seconds; the
    draft's size bound (prior.size_bound of the files); `beside` the share of the target's speed the draft's load
    takes while it runs beside the target's decodes."""

    name: str
    about: str
    t1: float
    curve: dict[int, float]
    draft: float
    draft_prefill: float
    prefill: float
    target_load: float
    draft_load: float
    bound: float
    beside: float
    host_round: float = HOST_ROUND
    host_position: float = HOST_POSITION
    host_draft: float = HOST_DRAFT

    def without_host(self) -> Profile:
        """The same machine with a loop that costs nothing outside llama_decode."""
        return replace(self, host_round=0.0, host_position=0.0, host_draft=0.0)

    def verify(self, n: int) -> float:
        ns = sorted(self.curve)
        if n in self.curve:
            return self.t1 * self.curve[n]
        if n > ns[-1]:
            step = self.curve[ns[-1]] - self.curve[ns[-2]]
            return self.t1 * (self.curve[ns[-1]] + (n - ns[-1]) * step / (ns[-1] - ns[-2]))
        a = max(m for m in ns if m < n)
        b = min(m for m in ns if m > n)
        return self.t1 * (self.curve[a] + (self.curve[b] - self.curve[a]) * (n - a) / (b - a))


PROFILES = {
    "gpu-fast": Profile(
        "gpu-fast",
        "7B Q4 target on a fast consumer GPU (RTX 4090 class: 6 ms a decode, 5 rows 1.3 decodes), 0.5B draft",
        t1=0.006,
        curve={1: 1.0, 2: 1.08, 4: 1.22, 5: 1.3, 8: 1.5, 16: 2.0, 32: 3.0, 64: 5.0},
        draft=0.1,
        draft_prefill=0.01,
        prefill=0.05,
        target_load=3.0,
        draft_load=0.5,
        bound=0.075,
        beside=0.1,
    ),
    "gpu": Profile(
        "gpu",
        "7B Q4 target on a consumer GPU, 0.5B draft",
        t1=0.022,
        curve={1: 1.0, 2: 1.01, 4: 1.02, 8: 1.04, 16: 1.08, 32: 1.3, 64: 1.9},
        draft=0.08,
        draft_prefill=0.004,
        prefill=0.01,
        target_load=3.0,
        draft_load=0.5,
        bound=0.075,
        beside=0.1,
    ),
    "laptop": Profile(
        "laptop",
        "3B target on an Apple laptop (Metal), 0.5B draft",
        t1=0.035,
        curve={1: 1.0, 2: 1.35, 4: 1.38, 8: 1.45, 16: 1.6, 32: 2.0, 64: 2.9},
        draft=0.22,
        draft_prefill=0.01,
        prefill=0.03,
        target_load=1.5,
        draft_load=0.3,
        bound=0.16,
        beside=0.2,
    ),
    "epyc": Profile(
        "epyc",
        "1.5B Q4_K_M on a compute-bound 2-core AMD EPYC, 0.5B draft",
        t1=0.0467,
        curve={1: 1.0, 2: 1.79, 4: 2.66, 8: 6.15, 16: 8.0, 32: 14.0, 64: 26.0},
        draft=0.51,
        draft_prefill=0.16,
        prefill=0.32,
        target_load=1.0,
        draft_load=0.35,
        bound=0.33,
        beside=0.5,
    ),
    "xeon-q8": Profile(
        "xeon-q8",
        "1.5B Q8_0 on a 2-core Intel Xeon (AMX), 0.5B draft",
        t1=0.119,
        curve={1: 1.0, 2: 1.06, 3: 1.24, 4: 1.35, 5: 2.13, 8: 3.03, 16: 3.71},
        draft=0.32,
        draft_prefill=0.052,
        prefill=0.2,
        target_load=1.2,
        draft_load=0.4,
        bound=0.19,
        beside=0.5,
    ),
}
TEXTS = (0.3, 0.6, 0.8, 0.95)  # the draft's per-token acceptance on the text (the target's confidence)


@dataclass(frozen=True)
class History:
    """Runs of one kind: `turns` answers of `tokens` each per process, after a `prompt`-token question (a chat
    adds `question` tokens a turn)."""

    name: str
    tokens: int
    turns: int = 1
    prompt: int = 60
    question: int = 30

    @property
    def session(self) -> bool:
        """A chat's turns are one session's answers."""
        return self.turns > 1


HISTORIES = {
    "short": History("short", 64),
    "long": History("long", 400),
    "chat": History("chat", 150, turns=5),
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimLoad:
    """A draft model's load beside the target on the simulated clock: ready `seconds` after it starts, its catch-up
    on `tokens` included; `slowing` while the clock is before that."""

    def __init__(self, clock: Clock, model: FakeModel, tokens: Sequence[int], seconds: float) -> None:
        self.clock, self.model = clock, model
        self.until = clock.now + seconds + max(len(tokens) - 1, 0) * model.batch
        model.tokens = list(tokens)
        model.n_decoded += len(tokens)

    @property
    def slowing(self) -> bool:
        return self.clock.now < self.until

    def ready(self) -> bool:
        return not self.slowing

    def result(self) -> FakeModel:
        self.clock.now = max(self.clock.now, self.until)
        return self.model

    def cancel(self) -> None:
        self.until = self.clock.now


class FakeModel:
    """A draft model that only keeps time: a one-token decode costs `token` seconds, a batch `batch` a token (each
    reported to the round's meter as llama.model's are), and the host `host` seconds a call (sampling the token it
    drafts)."""

    def __init__(self, clock: Clock, token: float, batch: float, host: float) -> None:
        self.clock, self.token, self.batch, self.host = clock, token, batch, host
        self.tokens: list[int] = []
        self.n_decoded = 0
        self._logits = np.zeros((1, 4), np.float32)

    def sync(self, tokens: list[int], n_logits: int = 1) -> np.ndarray:
        keep = len(self.tokens)
        if len(tokens) <= keep or tokens[:keep] != self.tokens:  # not an extension: the common prefix
            keep = next((i for i, (a, b) in enumerate(zip(tokens, self.tokens, strict=False)) if a != b), keep)
            keep = min(keep, len(tokens) - 1)
        new = len(tokens) - keep
        seconds = self.token if new == 1 else new * self.batch
        self.clock.now += seconds + self.host
        meter.decoded(new, seconds)
        self.tokens = list(tokens)
        self.n_decoded += new
        return self._logits

    def trim(self, n: int) -> None:
        del self.tokens[n:]

    def reset(self) -> None:
        self.tokens = []

    def remember(self) -> None:
        """Nothing to keep: a prompt cache saves no simulated time."""


class FakeTarget:
    """The target on the simulated clock: a batch of n rows costs the profile's curve (`slowed` beside a load);
    its logits say the text's acceptance `alpha` (the top probability, at the draft model's token 0). Its trim
    charges the round's fixed host time: the one call each round makes outside its timed spans."""

    n_vocab = 4

    def __init__(self, clock: Clock, profile: Profile, alpha: float, slowed: Callable[[float], float]) -> None:
        self.clock, self.profile, self.slowed = clock, profile, slowed
        self._row = np.log(np.array([alpha, *[(1 - alpha) / 3] * 3], np.float32))
        self._rows: dict[int, np.ndarray] = {}  # by batch size

    def sync(self, tokens: list[int], n_logits: int = 1, skip: Sequence[bool] = ()) -> np.ndarray:
        seconds = self.slowed(self.profile.verify(n_logits))
        self.clock.now += seconds
        meter.decoded(n_logits, seconds)
        if (rows := self._rows.get(n_logits)) is None:
            rows = self._rows[n_logits] = np.tile(self._row, (n_logits, 1))
        return rows

    def trim(self, n: int) -> None:
        self.clock.now += self.profile.host_round


class Verifier(InvariantSampling):
    """The verification stood in for: each draft token the draft model proposed (token 0) holds with the text's
    `alpha`, drawn from `rng`, until one does not (a probe's tokens never do); the target's own token (3)
    follows, and sampling each emitted position costs the host's `position` seconds."""

    def __init__(self, clock: Clock, rng: np.random.Generator, alpha: float, position: float) -> None:
        super().__init__(0)
        self.clock, self.rng, self.alpha, self.position = clock, rng, alpha, position

    def verify(self, p_at: PAt, draft: Sequence[int], pos: int) -> tuple[list[int], int]:
        n = 0
        while n < len(draft) and draft[n] == 0 and self.rng.random() < self.alpha:
            p_at(n)
            n += 1
        p_at(n)
        self.clock.now += self.position * (n + 1)
        return [*draft[:n], 3], n


@dataclass
class Store:
    """What the cost store keeps between runs of one pair: the target's quiet curve, the host's seconds (a round,
    a position, a draft token) and the draft's Kept."""

    curve: dict[int, float] = field(default_factory=dict)
    host: tuple[float, float, float] = (0.0, 0.0, 0.0)
    kept: Kept = field(default_factory=Kept)


@dataclass
class Machine:
    """One simulated process's clock, the seconds it spends outside its decoding (its loads and prefills), and the
    draft model's loads beside the target."""

    profile: Profile
    clock: Clock = field(default_factory=Clock)
    outside: float = 0.0
    loads: list[SimLoad] = field(default_factory=list)

    def spend(self, seconds: float) -> None:
        """Seconds outside the decoding: a load, a prefill."""
        self.clock.now += seconds
        self.outside += seconds

    def slowed(self, seconds: float) -> float:
        """The target's work of `seconds`, as long as a load beside it makes it (its share while they overlap)."""
        left = max((load.until - self.clock.now for load in self.loads), default=0.0)
        if left <= 0:
            return seconds
        rate = 1 - self.profile.beside
        return seconds / rate if seconds <= left * rate else left + seconds - left * rate

    def drafters(self, cost: CostModel | None, policy: DraftPolicy | None) -> list[Drafter]:
        """The draft model's drafters, loading on this clock (beside the target's work, or on the answer's path)."""
        p = self.profile
        model = FakeModel(self.clock, p.draft * p.t1, p.draft_prefill * p.t1, p.host_draft)

        def load(**_: Any) -> FakeModel:
            self.spend(p.draft_load)
            return model

        def beside(_: Any, tokens: Sequence[int]) -> SimLoad:
            self.loads.append(SimLoad(self.clock, model, tokens, p.draft_load))
            return self.loads[-1]

        return draft_model.drafters(
            load,  # type: ignore[arg-type]
            cost,
            policy=policy,
            path=Path("draft.gguf"),
            clock=self.clock,
            background=beside,  # type: ignore[arg-type]
        )


def _session(
    profile: Profile,
    history: History,
    alpha: float,
    rng: np.random.Generator,
    *,
    k: int | None,
    draft: bool,
    store: Store | None,
) -> tuple[float, int | None, float]:
    """One process: (its seconds, the answer position of the draft model's first draft in its first answer, its
    decoding's seconds: all but the loads and the prefills).

    k None with `store`: the default (the policy decides, from and into `store`); k > 0: the draft model at that
    fixed k; `draft` False: the target alone."""
    machine = Machine(profile)
    machine.spend(profile.target_load)
    cost = policy = None
    if store is not None:
        cost = CostModel(dict(store.curve))
        cost.host_round, cost.host_position, cost.host_draft = store.host
        if draft:
            policy = DraftPolicy.decide(
                "draft", "draft.gguf", store.kept, cost, bound=profile.bound, loaded_in=profile.target_load,
                named=False, session=history.session,
            )  # fmt: skip
            cost = policy.cost
    planner = Planner(machine.drafters(cost, policy) if draft else [], k=k if draft else 0, cost=cost)
    clock = machine.clock
    target = FakeTarget(clock, profile, alpha, machine.slowed)
    verifier = Verifier(clock, rng, alpha, profile.host_position)
    step = Round(target, planner, GREEDY, verifier, None, cost, Meter(clock))
    first = _answers(machine, history, planner, step, cost)
    if store is not None and cost is not None:
        store.curve = {n: s for n, s in cost.curve().items() if n <= 64}
        store.host = (cost.host_round, cost.host_position, cost.host_draft)
        if policy is not None:
            store.kept = policy.settle(cost, clock.now)
    return clock.now, first, clock.now - machine.outside


def _answers(machine: Machine, history: History, planner: Planner, step: Round, cost: CostModel | None) -> int | None:
    """The session's answers, each after its prefill, through the real round: the answer position of the draft
    model's first draft in the first answer (None: it drafted none)."""
    ctx: list[int] = []
    first: int | None = None
    for turn in range(history.turns):
        new = history.prompt if turn == 0 else history.question
        ctx += [1] * new
        for d in planner.drafters:
            d.begin(len(ctx))
        seconds = machine.slowed(new * machine.profile.prefill * machine.profile.t1)
        machine.spend(seconds)
        if cost is not None:
            cost.observe_prefill(new, seconds)
        ctx.append(2)  # the first token, from the prefill's logits
        out = 1
        while out < history.tokens:
            r = step(ctx, history.tokens - out - 1)
            if r.drafted and first is None and turn == 0 and isinstance(r.drafter, DraftModelDrafter):
                first = out
            ctx += r.tokens
            out += len(r.tokens)
        for d in planner.drafters:
            d.end(ctx)
    return first


def simulate(profile: Profile, history: History, alpha: float, runs: int, seed: int = 0) -> dict[str, Any]:
    """`runs` runs of the default against the target alone and each fixed k: the figures of one cell."""
    store = Store()
    rng = np.random.default_rng(seed)
    alone, _, alone_decode = _session(profile, history, alpha, rng, k=None, draft=False, store=None)
    sessions = {
        k: [
            _session(profile, history, alpha, np.random.default_rng(seed + r), k=k, draft=True, store=None)
            for r in range(5)
        ]
        for k in range(1, 9)
    }
    fixed = {k: statistics.mean(s[0] for s in runs_k) for k, runs_k in sessions.items()}
    best_k = min(fixed, key=lambda k: fixed[k])
    decode = statistics.mean(s[2] for s in sessions[best_k])
    seconds, firsts = [], []
    for r in range(runs):
        s, first, _ = _session(
            profile, history, alpha, np.random.default_rng(seed + 1000 + r), k=None, draft=True, store=store
        )
        seconds.append(s)
        firsts.append(first)
    return {
        "profile": profile.name,
        "history": history.name,
        "alpha": alpha,
        "alone": alone,
        "best_k": best_k,
        "best_fixed": fixed[best_k],
        "wins": fixed[best_k] < alone,  # the draft model at its best fixed k beats the target alone
        "first_draft": firsts[0],  # in run 1, the answer position it first drafted at
        "run1": alone / seconds[0],  # run 1's speedup over the target alone
        "later": statistics.median(fixed[best_k] / s for s in seconds[1:]) if runs > 1 else None,
        "regret": (sum(seconds) - runs * alone) / (runs * alone),  # seconds lost against the target alone, a share
        "speedup": runs * alone / sum(seconds),
        "best_speedup": alone / fixed[best_k],
        "best_decode_speedup": alone_decode / decode,  # its decoding alone, the loads and prefills left out
        "uses": store.kept.decision.uses,
    }


def with_and_without_host(profile: Profile, history: History, alpha: float, runs: int) -> dict[str, Any]:
    """One cell simulated with the host's time and again without it (`no_host`: the same figures)."""
    return {
        **simulate(profile, history, alpha, runs),
        "no_host": simulate(profile.without_host(), history, alpha, runs),
    }


def table(cells: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| profile | history | alpha | best fixed k (× alone; its decoding ×) | first draft in run 1 | run 1 | runs 2+ vs best k (median) | all runs × alone | regret | verdict | without host time: best fixed k (decoding ×), all runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        first = "—" if c["first_draft"] is None else f"token {c['first_draft']}"
        later = "—" if c["later"] is None else f"{c['later']:.2f}×"
        bare = c["no_host"]
        lines.append(
            f"| {c['profile']} | {c['history']} | {c['alpha']:.2f} | "
            f"k={c['best_k']} {c['best_speedup']:.2f}× ({c['best_decode_speedup']:.2f}×) | "
            f"{first} | {c['run1']:.2f}× | {later} | {c['speedup']:.2f}× | {max(c['regret'], 0) * 100:.1f}% | "
            f"{'uses' if c['uses'] else 'no'} | k={bare['best_k']} {bare['best_speedup']:.2f}× "
            f"({bare['best_decode_speedup']:.2f}×), {bare['speedup']:.2f}× |"
        )
    return "\n".join(lines)


def grid(
    profiles: Sequence[str], histories: Sequence[str], texts: Sequence[float], runs: int, *, each: Callable[..., Any]
) -> list[dict[str, Any]]:
    return [
        each(with_and_without_host(PROFILES[p], HISTORIES[h], a, runs))
        for p in profiles
        for h in histories
        for a in texts
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--histories", default=",".join(HISTORIES))
    parser.add_argument("--texts", default=",".join(map(str, TEXTS)))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cells = grid(
        args.profiles.split(","),
        args.histories.split(","),
        [float(a) for a in args.texts.split(",")],
        args.runs,
        each=lambda c: c,
    )
    print(table(cells))
    if args.json:
        args.json.write_text(json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
