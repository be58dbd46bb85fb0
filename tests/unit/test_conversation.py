"""A chat never loses a turn: what the model is shown slides past the oldest turns, the conversation and its
file keep them all; each chat saves to a file of its own (model-free: a stand-in pair whose template counts
words)."""

from __future__ import annotations

import itertools
import json
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.chat import drive

from localspec.core.sampling import SamplerSettings
from localspec.core.stats import Piece, Stats
from localspec.errors import LocalspecError
from localspec.frontends.chat import private_history
from localspec.frontends.conversation import LATEST, Conversation, find_session, new_session, saved_sessions


class Pair:
    """The LocalSpec a Conversation uses, without a model: a message renders as 4 tokens and one a word; a
    reply says "ok" and records the prompt it was given."""

    def __init__(self, n_ctx: int) -> None:
        self.n_ctx, self.prompts, self.prefilled = n_ctx, list[Any](), list[Any]()
        self.k, self.pair = None, "stand-in"
        self.config = SimpleNamespace(sampler=SamplerSettings(), seed=0)

    def tokens(self, messages: Sequence[dict[str, Any]], *, system: str | None = None, **_: Any) -> list[int]:
        words = sum(4 + len(str(m["content"]).split()) for m in messages) + (len(system.split()) if system else 0)
        return [1] * words

    def generate(self, prompt: Sequence[dict[str, Any]], **_: Any) -> Any:
        self.prompts.append(list(prompt))
        return Reply()

    def prefill(self, messages: Sequence[dict[str, Any]], *, system: str | None = None) -> None:
        self.prefilled.append(list(messages))

    def reset(self) -> None:
        pass


class Reply:
    text, tokens, stats = "ok", [7], Stats()

    def __iter__(self) -> Iterator[Piece]:
        yield Piece("ok", False)


def _conv(n_ctx: int = 1024, **kw: Any) -> Conversation:
    return Conversation(Pair(n_ctx), **kw)  # type: ignore[arg-type]


def _say(conv: Conversation, text: str) -> None:
    for _ in conv.reply(text):
        pass


def test_a_long_message_leaves_old_turns_out_of_the_window_not_the_conversation(tmp_path: Path) -> None:
    """`chat --ctx 1024`: twenty short turns, then one message longer than half the context: the model is shown
    what fits (as many turns as fit under half the context), the conversation and its saved file keep every
    user message."""
    conv = _conv(1024, max_tokens=128)
    for i in range(20):
        _say(conv, f"turn {i}: " + "word " * 20)
    long = "long " * 600
    _say(conv, long)
    users = [m["content"] for m in conv.messages if m["role"] == "user"]
    assert len(users) == 21 and users[-1] == long
    shown = conv.spec.prompts[-1]  # type: ignore[attr-defined]
    assert shown[-1]["content"] == long and shown[0]["role"] == "user"
    assert len(conv.spec.tokens(shown)) + 128 <= 1024
    assert any("left out of what the model sees" in n for n in conv.notices)
    conv.save(tmp_path / "chat.json")
    saved = json.loads((tmp_path / "chat.json").read_text())["messages"]
    assert [m["content"] for m in saved if m["role"] == "user"] == users


def test_the_window_moves_to_half_the_context_and_then_stays() -> None:
    """Once it must move, the window drops to half the context, so the next turns fit as they are (their cache
    positions shift once every few turns, not at every turn)."""
    conv = _conv(512, max_tokens=64)
    starts = []
    for i in range(40):
        _say(conv, f"turn {i}: " + "word " * 10)
        starts.append(conv.start)
    moves = sum(a != b for a, b in itertools.pairwise(starts))
    assert 0 < moves <= 40 // 8 and len(conv.messages) == 80


def test_a_resumed_conversation_longer_than_the_context_is_shown_in_part_and_kept_whole(tmp_path: Path) -> None:
    big = _conv(4096)
    for i in range(30):
        _say(big, f"turn {i}: " + "word " * 30)
    big.save(tmp_path / "chat.json")
    small = _conv(512, max_tokens=64)
    small.load(tmp_path / "chat.json")
    assert len(small.messages) == 60 and small.start > 0
    shown = small.spec.prefilled[-1]  # type: ignore[attr-defined]
    assert len(small.spec.tokens(shown)) + 64 <= 512 and shown == small.messages[small.start :]
    _say(small, "one more")
    small.save(tmp_path / "chat.json")
    assert len(json.loads((tmp_path / "chat.json").read_text())["messages"]) == 62


def test_a_message_that_cannot_fit_alone_is_refused_and_nothing_moves() -> None:
    conv = _conv(256, max_tokens=16)
    _say(conv, "hello")
    with pytest.raises(LocalspecError, match="too many"):
        conv.reply("x " * 300)
    assert len(conv.messages) == 2 and conv.start == 0


def test_each_chat_has_its_own_file_and_resume_finds_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    with pytest.raises(LocalspecError, match="no saved conversation"):
        find_session(LATEST)
    first, second = new_session(), new_session()
    assert first != second and first.parent == second.parent
    a, b = _conv(), _conv()
    _say(a, "first chat")
    _say(b, "second chat")
    a.save(first)
    b.save(second)
    os.utime(first, (1, 1))  # the older of the two
    assert saved_sessions() == [second, first] and find_session(LATEST) == second
    assert find_session(first.stem) == first and find_session(str(first)) == first
    with pytest.raises(LocalspecError, match="no one saved conversation"):
        find_session("nothing-like-it")
    out = drive(_conv(), "/sessions\r/exit\r")
    assert first.stem in out and "second chat" in out


def test_load_refuses_what_is_not_a_conversation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": 3}')
    out = drive(_conv(), f"/load {bad}\r/exit\r")
    assert "is not a saved localspec conversation" in out


def test_the_input_history_is_private_and_bounded(tmp_path: Path) -> None:
    history = tmp_path / "history"
    history.write_text("".join(f"\n# 2026-01-01 00:00:{i:02d}\n+line {i}\n" for i in range(50)))
    os.chmod(history, 0o644)
    private_history(history, keep=10)
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    text = history.read_text()
    assert text.count("\n# ") == 10 and "+line 49" in text and "+line 39" not in text


def test_a_saved_message_without_text_or_nested_without_end_loads_or_is_refused_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "null.json"
    empty.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null}]}')
    conv = _conv()
    drive(conv, f"/load {empty}\r/exit\r")
    assert [m["content"] for m in conv.messages] == ["hi", ""]
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    assert "is not a saved localspec conversation" in drive(_conv(), f"/load {deep}\r/exit\r")


def test_a_thousand_turn_conversation_resumes_with_a_dozen_renderings(tmp_path: Path) -> None:
    saved = tmp_path / "long.json"
    turns = [{"role": r, "content": f"turn {i} " + "word " * 20} for i in range(500) for r in ("user", "assistant")]
    saved.write_text(json.dumps({"version": 1, "messages": turns}))
    conv = _conv(n_ctx=4096)
    rendered = 0
    tokens = conv.spec.tokens

    def counted(*a: Any, **k: Any) -> list[int]:
        nonlocal rendered
        rendered += 1
        return tokens(*a, **k)

    conv.spec.tokens = counted  # type: ignore[method-assign]
    conv.load(saved)
    assert rendered <= 16 and len(conv.messages) == 1000
    window = conv.window
    assert window[0]["role"] == "user" and len(conv._rendered(window)) + conv._room <= 2048  # half the context
    longer = conv.messages[conv.start - 2 :]
    assert len(conv._rendered(longer)) + conv._room > 2048  # and as many turns as fit there
