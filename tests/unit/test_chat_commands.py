"""The chat's slash commands, parsed and dispatched without a model (a stand-in conversation)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.chat import drive

from localspec.core.sampling import SamplerSettings
from localspec.core.stats import Stats
from localspec.errors import LocalspecError
from localspec.frontends.chat import COMMANDS, help_text


def _conversation() -> SimpleNamespace:
    """What the slash commands touch of a Conversation and its LocalSpec, with no model behind it."""

    def load(path: object) -> None:
        raise LocalspecError(f"cannot read {path}: No such file or directory")

    spec = SimpleNamespace(k=None, pair="stand-in ← draft", check_response_format=lambda form: None)
    return SimpleNamespace(
        spec=spec,
        sampler=SamplerSettings(),
        seed=0,
        max_tokens=64,
        last=None,
        totals=Stats(),
        replies=0,
        messages=[],
        system=None,
        load=load,
        save=lambda path: None,
        clear=lambda: None,
        prefill=lambda: None,
    )


@pytest.mark.parametrize(
    "line,expect",
    [
        ("/set k 8", "k = 8"),
        ("/set temperature 0.5", "temperature = 0.5"),
        ("/set top_p 0.9", "top_p = 0.9"),
        ("/set top_k 10", "top_k = 10"),
        ("/set min_p 0.1", "min_p = 0.1"),
        ("/set max_tokens 16", "max_tokens = 16"),
        ("/set seed 42", "seed = 42"),
        ("/set k -1", "error: k"),
        ("/set k 65", "error: k"),
        ("/set k x", "error: k"),
        ("/set temperature nan", "error: temperature"),
        ("/set top_p 0", "error: top_p"),
        ("/set top_k -3", "error: top_k"),
        ("/set min_p 2", "error: min_p"),
        ("/set max_tokens 0", "error: max_tokens"),
        ("/set seed -5", "error: seed"),
        ("/set volume 3", "error: cannot set"),
        ("/set k", "error: usage"),
        ("/color maybe", "error: usage"),
        ("/save", "error: usage"),
        ("/load", "error: usage"),
        ("/load /nonexistent/x.json", "error: no one saved conversation"),
        ("/system", "error: usage"),
        ("/schema", "error: usage"),
        ("/schema /nonexistent/s.json", "error: cannot read"),
        ("/schema off", "replies are free text"),
        ("/predict", "error: usage"),
        ("/predict /nonexistent/f.py", "error: cannot read"),
        ("/frobnicate", "error: unknown command"),
        ("/help", "/set NAME VALUE"),
        ("/stats", "last reply: none yet"),
    ],
)
def test_slash_commands(line: str, expect: str) -> None:
    out = drive(_conversation(), f"{line}\r/exit\r")  # type: ignore[arg-type]
    assert expect in out


def test_set_changes_the_settings() -> None:
    conv = _conversation()
    drive(
        conv,  # type: ignore[arg-type]
        "/set k 6\r/set temperature 0.7\r/set top_k 5\r/set top_p 0.5\r/set min_p 0.2\r"
        "/set max_tokens 7\r/set k auto\r/exit\r",
    )
    s = conv.sampler
    assert conv.spec.k is None and conv.max_tokens == 7
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (0.7, 5, 0.5, 0.2)


def test_help_lists_every_command() -> None:
    text = help_text()
    assert all(name in text for name in COMMANDS) and "Esc Enter" in text
