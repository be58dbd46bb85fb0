"""A chat's saved conversations are never overwritten by another conversation: a new one (/clear, /system) and one
loaded (/load) save to their own files, and two chats never share one. A stand-in answers (no model)."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.chat import drive

from localspec.core.sampling import SamplerSettings
from localspec.core.stats import Piece
from localspec.frontends.conversation import Conversation, Session, sessions_dir


class Echo(Conversation):
    """A conversation whose replies repeat the message: saving, loading and clearing are the real ones."""

    def reply(self, text: str) -> Generator[Piece, None, None]:
        self.messages.append({"role": "user", "content": text})
        yield Piece(f"echo {text}", False)
        self.messages.append({"role": "assistant", "content": f"echo {text}"})


def _echo() -> Echo:
    config = SimpleNamespace(sampler=SamplerSettings(), seed=0)
    spec = SimpleNamespace(
        config=config,
        n_ctx=4096,
        tokens=lambda messages, system=None: [0] * len(messages),
        reset=lambda: None,
        prefill=lambda *a, **k: None,
        k=None,
        pair="stand-in",
    )
    return Echo(spec)  # type: ignore[arg-type]


def _said(path: Path) -> list[str]:
    return [m["content"] for m in json.loads(path.read_text())["messages"] if m["role"] == "user"]


@pytest.fixture(autouse=True)
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))


def test_a_new_or_loaded_conversation_saves_to_a_file_of_its_own() -> None:
    first = Session()
    start = first.path
    drive(_echo(), "one\r/clear\rtwo\r/system be brief\rthree\r/exit\r", autosave=first)
    files = sorted(sessions_dir().glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    assert [_said(p) for p in files] == [["one"], ["two"], ["three"]]
    assert files[0] == start and files[2] == first.path
    first.release()
    second = Session()
    mine = second.path
    drive(_echo(), f"four\r/load {files[0]}\rfive\r/exit\r", autosave=second)
    assert _said(mine) == ["four"]  # this chat's own conversation is kept
    assert _said(files[0]) == ["one", "five"]  # the loaded session goes on in its file


def test_a_file_from_elsewhere_is_continued_in_a_new_session(tmp_path: Path) -> None:
    outside = tmp_path / "mine.json"
    outside.write_text(json.dumps({"version": 1, "messages": [{"role": "user", "content": "kept"}]}))
    session = Session()
    drive(_echo(), f"/load {outside}\rmore\r/exit\r", autosave=session)
    assert _said(outside) == ["kept"]
    assert _said(session.path) == ["kept", "more"] and session.path.parent == sessions_dir()


def test_two_chats_resuming_one_session_never_share_its_file() -> None:
    first = Session()
    drive(_echo(), "one\r/exit\r", autosave=first)
    other = Session()
    note = other.continue_with(first.path)  # the first chat still holds it
    assert note is not None and "another chat" in note and other.path != first.path
    first.release()
    assert Session().continue_with(first.path) is None  # free again: continued
