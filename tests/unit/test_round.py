"""The round's meter and the one place its record is learned from (CostModel.learn): no model, a hand-driven clock."""

from __future__ import annotations

import threading

import pytest

from localspec.core import meter
from localspec.core.meter import Meter, Times
from localspec.drafting.costs import CostModel


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _round(clock: Clock, m: Meter, *, load: float = 0.0) -> Times:
    """A round of 3 draft-model tokens (10 ms each, 1 ms of sampling each), a 4-row verify of 50 ms (48 ms in
    llama_decode), 2 ms sampling 2 positions, 1 ms of the loop's own; a load of `load` seconds before drafting."""
    m.start()
    with m.span("draft"):
        if load:
            clock.now += load
            meter.decoded(0, load)
        for _ in range(3):
            clock.now += 0.010
            meter.decoded(1, 0.010)
            clock.now += 0.001
    with m.span("verify"):
        clock.now += 0.002
        meter.decoded(4, 0.048)
        clock.now += 0.048
    with m.span("sample"):
        clock.now += 0.002
    clock.now += 0.001
    m.times.rows, m.times.positions, m.times.drafted = 4, 2, 3
    return m.read()


def test_a_rounds_record_splits_its_time_where_it_was_spent() -> None:
    clock = Clock()
    times = _round(clock, Meter(clock))
    assert times.total == pytest.approx(0.086)
    assert times.spans == pytest.approx({"draft": 0.033, "verify": 0.050, "sample": 0.002})
    assert times.decoding("verify") == pytest.approx(0.048)
    assert times.draft_host == pytest.approx(0.003)
    assert times.host == pytest.approx(0.003)  # the loop's own 1 ms and the verify's 2 ms outside llama_decode


def test_decodes_outside_a_span_or_on_another_thread_belong_to_no_round() -> None:
    clock = Clock()
    m = Meter(clock)
    m.start()
    meter.decoded(5, 1.0)  # between spans: the prefill's, say
    with m.span("verify"):
        other = threading.Thread(target=meter.decoded, args=(64, 2.0))  # a draft model catching up as it loads
        other.start()
        other.join()
        meter.decoded(2, 0.1)
    assert m.read().decodes == {"draft": [], "verify": [(2, 0.1)], "sample": []}


def test_the_cost_model_learns_every_figure_from_one_record() -> None:
    clock = Clock()
    cost = CostModel({})
    cost.learn(_round(clock, Meter(clock)))
    assert cost.draft == pytest.approx(0.010)
    assert cost.host_draft == pytest.approx(0.001)
    assert cost.verify == pytest.approx({4: 0.050})
    assert cost.host_round == pytest.approx(0.003)
    assert cost.host_position == pytest.approx(0.001)


def test_a_load_on_the_answers_path_is_no_drafting_time() -> None:
    clock = Clock()
    cost = CostModel({})
    cost.learn(_round(clock, Meter(clock), load=0.5))
    assert cost.host_draft == pytest.approx(0.001)  # not the half second of the load
    assert cost.draft == pytest.approx(0.010)
    assert cost.host_round == pytest.approx(0.003)


def test_rows_a_grammar_decided_teach_no_batch_cost() -> None:
    clock = Clock()
    m = Meter(clock)
    times = _round(clock, m)
    times.whole = False
    cost = CostModel({})
    cost.learn(times)
    assert not cost.measured
