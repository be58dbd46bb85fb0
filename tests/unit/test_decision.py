"""The draft-model decision over many runs: hysteresis, the exploration budget, kept state, shared files."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.drafting.kept import BUDGET, MAX_WAIT, NOISE, Choice, DraftDecision, Kept
from localspec.drafting.policy import DraftPolicy
from localspec.files import read_json, update_json

TRACE = Path(__file__).resolve().parents[2] / "scripts" / "margin-trace.json"


def _history(margins: list[float], seconds: float = 20.0, try_cost: float = 1.5) -> tuple[list[Choice], list[bool]]:
    """Choices and verdicts of a run per margin measured where the draft model is loaded (a skipped run
    recomputes the margin from the kept costs: the last one measured)."""
    d, choices, verdicts, kept = DraftDecision(), [], [], None
    for i, m in enumerate(margins):
        choice = d.choice(try_cost, may_win=False)
        measured = m if choice != "skip" else kept
        if choice != "skip":
            kept = m
        d.settle(choice, margin=None if i == 0 else measured, seconds=seconds, lost=try_cost)
        d = DraftDecision.from_json(json.loads(json.dumps(d.to_json())))  # saved and loaded between runs
        choices.append(choice)
        verdicts.append(d.uses)
    return choices, verdicts


def _flips(verdicts: list[bool]) -> int:
    return sum(a != b for a, b in itertools.pairwise(verdicts))


def test_the_recorded_borderline_history_tries_once_and_keeps_its_verdict() -> None:
    """Margins measured by repeated tries of the draft model with a Q8_0 target (scripts/margin_noise.py):
    replayed as ten runs from a fresh cache, at most one run tries it, and the verdict never moves after."""
    trace = json.loads(TRACE.read_text())
    margins = [r["margin"] for r in trace["runs"]]
    seconds = [r["seconds"] for r in trace["runs"]]
    history = (margins * 3)[:10]
    choices, verdicts = _history(history, seconds=min(seconds), try_cost=max(r["try"] for r in trace["runs"]))
    assert choices.count("try") == 1, choices  # tried: a budget of tries that never tries would pass the rest
    first = choices.index("try")
    assert _flips(verdicts[first:]) <= 1 and len(set(verdicts[first + 1 :])) <= 1, verdicts


def test_the_noise_band_covers_the_measured_spread() -> None:
    """NOISE is at least twice the recorded tries' range of margins."""
    summary = json.loads(TRACE.read_text())["summary"]
    assert 2 * summary["range"] <= NOISE, summary


@pytest.mark.parametrize("true_margin", [0.9, 0.95, 1.0, 1.05, 1.1, 1.15])
def test_a_noisy_margin_near_the_threshold_never_oscillates(true_margin: float) -> None:
    """400 runs with a margin measured at sd 0.03 around values near 1: the draft model is tried, the verdict moves
    at most once (to use it where it clearly wins, never where it clearly loses), and the tries' cost stays under
    the budget at every run."""
    rng = random.Random(7)
    d, verdicts, kept, tried = DraftDecision(), [], None, 0
    for i in range(400):
        choice = d.choice(1.0, may_win=False)
        tried += choice == "try"
        if choice != "skip":
            kept = true_margin + rng.gauss(0, 0.03)
        d.settle(choice, margin=kept if i else None, seconds=15.0, lost=rng.uniform(0.5, 2.0))
        verdicts.append(d.uses)
        assert d.try_seconds <= BUDGET * d.user_seconds + 1e-9
    assert tried and _flips(verdicts) <= 1
    if abs(true_margin - 1) > NOISE:
        assert verdicts[-1] == (true_margin > 1), verdicts[-1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.2, 300.0), st.floats(0.0, 2.0), st.floats(0.0, 2.0)),
        min_size=1,
        max_size=120,
    )
)
def test_tries_cost_under_the_budget_on_any_history(runs: list[tuple[float, float, float]]) -> None:
    """Runs of any length, tries costing up to twice the last one (or the estimate), uses that end losing as
    much, margins anywhere: the seconds spent on tries and ended uses never pass BUDGET of the user's seconds
    by more than one ended use's loss (charged after its run), and no two runs in a row are tries."""
    d, last, estimate, ended = DraftDecision(), "skip", 1.0, 0.0
    for i, (seconds, margin, cost_share) in enumerate(runs):
        choice = d.choice(estimate, may_win=False)
        cost = cost_share * (d.last_try if d.last_try is not None else estimate)
        before = d.try_seconds
        d.settle(choice, margin=margin if i and choice != "skip" else None, seconds=seconds, lost=cost)
        if choice == "use" and not d.uses:
            ended = max(ended, d.try_seconds - before)
        assert d.try_seconds <= BUDGET * d.user_seconds + ended + 1e-9
        assert not (choice == last == "try")
        last = choice


def test_a_loser_is_tried_less_and_less_often() -> None:
    """A draft model that keeps losing is tried at doubling intervals, up to MAX_WAIT runs apart."""
    d, tries = DraftDecision(), []
    for i in range(2000):
        choice = d.choice(0.1, may_win=False)
        d.settle(choice, margin=0.5 if i else None, seconds=20.0, lost=0.1)
        if choice == "try":
            tries.append(i)
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps == sorted(gaps) and max(gaps) <= MAX_WAIT + 1 and len(tries) < 40
    assert not d.uses


def test_a_winner_found_by_a_try_is_used_until_it_clearly_loses() -> None:
    """The margin accumulates answers' evidence (each moves it halfway): one unlucky answer does not end a use
    that earlier answers found winning; answers that keep losing do."""
    d = DraftDecision(runs=5, user_seconds=1000.0)
    assert d.choice(1.0, may_win=False) == "try"
    d.settle("try", margin=1.2, seconds=20.0, lost=1.0)
    assert d.uses and d.choice(1.0, may_win=False) == "use"
    for m in (1.1, 0.85):  # the unlucky answer: 0.85
        d.settle("use", margin=m, seconds=20.0)
        assert d.uses
    d.settle("use", margin=0.8, seconds=20.0)
    assert not d.uses and d.margin is not None and d.margin < 1 - NOISE


def test_a_promise_that_answers_do_not_keep_is_used_ever_more_rarely() -> None:
    """Its costs promise a win (each try says 1.15) but answers realize a loss (0.85, losing 1.5 s of a 15 s
    run): each use ends after two runs (the margin moves halfway each), the wait before the next try doubles
    every time, and what the tries and the lost uses cost stays near the budget."""
    d, used = DraftDecision(), []
    for i in range(600):
        choice = d.choice(1.0, may_win=False)
        if choice == "use":
            used.append(i)
        margin = {"try": 1.15, "use": 0.85}.get(choice)  # a run without the draft model says nothing of it
        d.settle(choice, margin=margin, seconds=15.0, lost={"try": 1.0, "use": 1.5}.get(choice, 0.0))
    episodes = [i for i in used if i - 1 not in used]  # the first run of each stretch of uses
    assert all(i + 1 in used and i + 2 not in used for i in episodes)  # two runs each
    gaps = [b - a for a, b in itertools.pairwise(episodes)]
    # ever further apart, then capped (a margin lowered by lost uses takes two tries to clear again)
    assert len(episodes) <= 15 and gaps == sorted(gaps) and max(gaps) <= 2 * (MAX_WAIT + 2)
    assert d.try_seconds <= BUDGET * d.user_seconds + 2 * 2 * 1.5


@pytest.mark.parametrize("data", [None, "one", 0.0, [], {"uses": "yes", "runs": -3, "wait": 1.5, "margin": "x"}])
def test_a_damaged_decision_starts_afresh(data: object) -> None:
    assert DraftDecision.from_json(data) == DraftDecision()


def _cycles(folder: str, worker: int, n: int) -> None:
    """`n` load-learn-save cycles on the real cost and vocabulary stores, each for a model file of its own."""
    import os

    import localspec.models.vocab as vocab
    from localspec.drafting import store
    from localspec.drafting.costs import CostModel

    os.environ["LOCALSPEC_CACHE_DIR"] = folder
    vocab.mismatch_uncached = lambda target, draft: None  # the headers' comparison is not what is tested
    for i in range(n):
        path = Path(folder) / f"m{worker}-{i}.gguf"
        path.write_bytes(b"x")
        key = store.key(path, threads=2, gpu_layers=0, ctx=4096)
        assert store.costs(key) is None
        store.keep(key, CostModel({1: 0.01 + i / 1e4}))
        assert vocab.mismatch(path, Path(folder) / "draft.gguf") is None


def test_four_processes_learning_at_once_lose_nothing(tmp_path: Path) -> None:
    """4 processes x 250 load-learn-save cycles on the cost and vocabulary caches: every entry is kept and both
    files are whole."""
    (tmp_path / "draft.gguf").write_bytes(b"x")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_cycles, args=(str(tmp_path), w, 250)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    costs = json.loads((tmp_path / "costs.json").read_text())
    checks = json.loads((tmp_path / "vocab-checks.json").read_text())
    assert len(costs) == 1000 and all(entry["verify"]["1"] > 0 for entry in costs.values())
    assert len(checks) == 1000 and set(checks.values()) == {None}
    assert not list(tmp_path.glob("*.damaged")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("damage", [b"", b'{"a": ', b"null", b"\xff\xfe", b"[1, 2]"])
def test_a_damaged_file_is_set_aside_and_rebuilt(tmp_path: Path, damage: bytes) -> None:
    path = tmp_path / "costs.json"
    path.write_bytes(damage)
    assert read_json(path) == {}
    assert (tmp_path / "costs.json.damaged").read_bytes() == damage and not path.exists()
    assert update_json(path, lambda store: store.__setitem__("k", 1))
    assert json.loads(path.read_text()) == {"k": 1}


def test_an_unwritable_folder_is_a_note_not_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not update_json(blocker / "costs.json", lambda store: None)
    assert "could not write" in capsys.readouterr().err


def test_an_answer_that_loses_with_the_draft_model_ends_its_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settling a session judges the draft model by what its rounds realized (its load included) once it drafted
    JUDGED_ROUNDS rounds, not by its costs' promise, and keeps its learned agreement and its load's seconds for
    the next run, all as its drafter reported them to the policy; a session that never loaded it says nothing of
    it."""
    import json
    from types import SimpleNamespace

    from localspec.drafting import store
    from localspec.drafting.costs import CostModel
    from localspec.drafting.draft_model import DraftModelDrafter
    from localspec.drafting.policy import JUDGED_ROUNDS

    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    path = tmp_path / "target.gguf"
    path.write_bytes(b"x")
    tkey = store.key(path, threads=2, gpu_layers=0, ctx=4096)
    cost = CostModel({1: 0.1, 5: 0.14}, draft=0.01)  # its costs promise a clear win
    policy = DraftPolicy("draft", "draft.gguf", "use", Kept(DraftDecision(uses=True, wait=4)), 0.2, cost)
    draft = SimpleNamespace(tokens=[], path="draft.gguf", remember=lambda: None)
    losing = DraftModelDrafter(lambda: draft, cost, policy=policy, path=Path("draft.gguf"))  # type: ignore[arg-type,return-value]
    policy.loaded(0.4, 0.4)  # its load took 0.4 s, all of it the target's (as on the answer's path)
    for _ in range(JUDGED_ROUNDS):
        policy.drafted(0.30, 0.25, trial=False)  # each round took longer than the target alone for its tokens
        losing.acceptance.observe(drafted=4, accepted=1, confidence=[0.8, 0.8])  # 1 in 2 held where 0.8 was hoped
    losing.end([])  # the answer ends: the agreement its rounds showed is reported
    store.settle(tkey, cost, policy, 20.0)
    decision = store.kept(tkey, "draft").decision
    assert not decision.uses and decision.wait == 8 and decision.margin == pytest.approx(2.0 / 2.4)
    assert decision.try_seconds == pytest.approx(2.8 - 2.0)  # the ended use's loss counts against the budget
    entry = json.loads((tmp_path / "costs.json").read_text())[tkey]
    assert entry["draft_load"] == {"draft": 0.4}
    assert entry["agreement"]["draft"] == pytest.approx(losing.acceptance.learned)
    assert losing.acceptance.agreement < 0.9
    unloaded = DraftPolicy("draft", "draft.gguf", "use", Kept(DraftDecision(uses=True)), 0.2, cost)  # a short answer
    store.settle(tkey, cost, unloaded, 2.0)
    assert unloaded.kept.decision.uses and unloaded.kept.decision.runs == 1  # nothing new about the draft model
    assert json.loads((tmp_path / "costs.json").read_text())[tkey]["agreement"] == entry["agreement"]


@pytest.mark.parametrize("kept", [Kept(), Kept(draft=0.02, draft_prefill=0.004), Kept(DraftDecision(margin=0.9))])
@pytest.mark.parametrize("named", [False, True])
def test_deciding_prices_a_copy_and_leaves_the_cost_model_it_is_handed(kept: Kept, named: bool) -> None:
    """Whatever it chooses, the policy prices its own copy of the cost model (measured costs, or a guess by the
    draft's size) and never changes the one it is handed."""
    import copy

    from localspec.drafting.costs import CostModel

    for curve in ({}, {1: 0.05, 2: 0.06, 4: 0.07}):
        cost = CostModel(dict(curve))
        before = copy.deepcopy(cost)
        policy = DraftPolicy.decide("d", "d.gguf", kept, cost, bound=0.2, loaded_in=1.0, named=named)
        assert cost == before and policy.cost is not cost
        assert not curve or policy.choice == "skip" or policy.cost.draft_step > 0  # priced where it may draft
