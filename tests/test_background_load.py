"""The draft model loads beside the target's work: nothing waits for it, a cancelled load leaves nothing behind,
it joins at a round boundary with the target's text unchanged, and its load is priced over a session."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import assert_same_tokens, joined_once_loaded

from localspec.core.sampling import SamplerSettings
from localspec.decoding.engine import Request
from localspec.decoding.loader import RunConfig, draft_drafter, load_engine
from localspec.drafting.costs import CostModel
from localspec.drafting.draft_model import BackgroundLoad
from localspec.drafting.kept import Kept
from localspec.drafting.policy import SESSION_TOKENS, DraftPolicy
from localspec.llama.model import Cancelled

GPU_CURVE = {1: 0.010, 2: 0.010, 4: 0.011, 8: 0.011, 16: 0.012, 32: 0.014, 64: 0.020}  # nearly flat


def _load_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "localspec-draft-load"]


def test_a_cancelled_load_leaves_no_thread_and_frees_what_it_loaded() -> None:
    """Cancelled while it loads, the load stops (llama.cpp's progress callback says so) and its thread ends; cancelled
    once loaded, the model it loaded is closed; a failed load says why in one line and gives nothing."""
    started, closed = threading.Event(), []

    def slow(cancel: threading.Event) -> Any:
        started.set()
        cancel.wait()  # a load that ends only when cancelled
        raise Cancelled("the load was cancelled")

    load = BackgroundLoad(slow)
    assert started.wait(10) and not load.ready()
    load.cancel()
    assert load.ready() and load.result() is None and not _load_threads()

    model = SimpleNamespace(close=lambda: closed.append(1), sync=lambda tokens, n: None)
    done = BackgroundLoad(lambda cancel: model, [1, 2, 3])  # type: ignore[arg-type, return-value]
    assert done.result() is model
    done.cancel()
    assert closed == [1] and done.result() is None and not _load_threads()

    said: list[str] = []

    def broken(cancel: threading.Event) -> Any:
        raise OSError("no such file")

    failed = BackgroundLoad(broken, warn=said.append)
    assert failed.result() is None and len(said) == 1 and "no such file" in said[0] and "\n" not in said[0]


def _policy(*, session: bool, kept: Kept | None = None) -> DraftPolicy:
    cost = CostModel(dict(GPU_CURVE), draft=0.001, draft_prefill=0.0002)
    return DraftPolicy("d", "d.gguf", "explore", kept or Kept(load=0.2), 0.075, cost, 3.0, session=session)


def test_a_session_prices_the_load_over_its_tokens_an_answer_over_its_own() -> None:
    """One answer spreads the load's price over as many tokens as it has (or as this pair's answers were long),
    never past its room; a chat or a server over the session's tokens (SESSION_TOKENS before any was measured, then
    what its sessions produced), the answers before included; settling a session keeps how long it was. A load
    that would be ready only after the horizon is not started."""
    answer, session = _policy(session=False), _policy(session=True)
    cost = answer.cost
    one = answer.terms(cost, answer=40, room=60, alpha=0.9)
    many = session.terms(cost, answer=40, room=60, alpha=0.9)
    assert one is not None and many is not None
    assert one.horizon == 40 and many.horizon == SESSION_TOKENS - 40
    assert one.load == pytest.approx(many.load) and 0 < one.load < 0.2 / 2  # the share of it the target pays
    session.answered(300, None)
    later = session.terms(cost, answer=40, room=60, alpha=0.9)
    assert later is not None and later.horizon == SESSION_TOKENS - 340
    kept = session.settle(cost, 10.0)
    assert kept.session == 300
    measured = _policy(session=True, kept=Kept(load=0.5, beside=0.02, session=200.0))
    terms = measured.terms(cost, answer=150, room=60, alpha=0.9)
    assert terms is not None and terms.horizon == 150 and terms.load == 0.02  # ski rental; its measured price
    slow = _policy(session=False, kept=Kept(load=2.0)).terms(cost, answer=40, room=60, alpha=0.9)
    assert slow is not None and slow.horizon == 0  # ready only after some 180 more tokens: never started here


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [SamplerSettings(temperature=0), SamplerSettings(temperature=0.8, top_k=40)])
def test_a_draft_model_joining_mid_answer_gives_the_target_alones_text(
    target_path: Path, draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampler: SamplerSettings
) -> None:
    """A draft model in use starts loading at the answer's first round, on its own thread; the target decodes
    alone until it is ready, and it drafts from a later token. The text is the target alone's (greedy and
    seeded), and the figures say when it joined and what its load cost the target."""
    import json

    from test_waiting import _write_costs

    from localspec.api import Generation

    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    _write_costs(tmp_path, target_path, draft_path, GPU_CURVE, draft_token=0.002, ctx=2048)
    engine, policy = load_engine(RunConfig(sampler=sampler, ctx=2048, gpu_layers=0, draft_gpu_layers=0, recall=False))
    drafter = draft_drafter(engine)
    assert drafter is not None and drafter.loaded is None and policy is not None and policy.choice == "use"
    prompt = engine.target.tokenize("def fibonacci(n):\n    ", add_bos=True)
    run = Generation(engine, Request(tuple(prompt), 96, sampler, seed=5))
    joined_once_loaded(run, drafter)
    joined = run.stats.first_drafts.get("draft_model")
    assert drafter.loaded is not None and joined is not None and joined > 1, run.stats.first_drafts
    assert run.stats.draft_load_beside is not None and run.stats.draft_load_beside >= 0
    assert "draft model drafting from token" in run.stats.summary()
    assert json.dumps(run.stats.to_dict())  # --json carries them
    got = run._run.tokens
    engine.k = 0
    engine.target.reset()
    alone = engine.generate(Request(tuple(prompt), 96, sampler, seed=5))
    "".join(p.text for p in alone)
    assert_same_tokens(engine.target, prompt, got, alone.tokens, sampler, seed=5)
    assert not _load_threads()
