"""The process's start on the clock its figures use: a suspended machine's sleep is not the process's time."""

from __future__ import annotations

import time

import pytest

import localspec.process as process


def test_the_start_is_before_the_import_and_close_to_it() -> None:
    started = process.started()
    assert started <= process.IMPORTED and process.IMPORTED - started <= process.MAX_STARTUP


def test_a_sleep_since_the_import_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A laptop suspended for 273 s while localspec ran: the boot clock counts the sleep, the start does not."""
    age = process._age()
    slept = process._slept()
    monkeypatch.setattr(process, "_age", lambda: age + 273.0)
    monkeypatch.setattr(process, "_slept", lambda: slept + 273.0)
    assert abs(process.started() - (time.perf_counter() - age)) < 1.0


def test_clocks_that_disagree_fall_back_to_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sleep before the import, or a sandbox whose boot clock is not its processes' start's: the import time."""
    age = process._age()
    monkeypatch.setattr(process, "_age", lambda: age + 273.0)
    assert process.started() == process.IMPORTED
    monkeypatch.setattr(process, "_age", lambda: -5.0)
    assert process.started() == process.IMPORTED
