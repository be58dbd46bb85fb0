"""The draft model loads beside the target's work: nothing waits for it, a cancelled load leaves nothing behind,
it joins at a round boundary with the target's text unchanged, and its load is priced over a session."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from support.costs import GPU_CURVE
from support.loads import load_threads

from localspec.drafting.costs import CostModel
from localspec.drafting.draft_model import BackgroundLoad
from localspec.drafting.kept import Kept
from localspec.drafting.policy import SESSION_TOKENS, DraftPolicy
from localspec.llama.model import Cancelled


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
    assert load.ready() and load.result() is None and not load_threads()

    model = SimpleNamespace(close=lambda: closed.append(1), sync=lambda tokens, n: None)
    done = BackgroundLoad(lambda cancel: model, [1, 2, 3])  # type: ignore[arg-type, return-value]
    assert done.result() is model
    done.cancel()
    assert closed == [1] and done.result() is None and not load_threads()

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
