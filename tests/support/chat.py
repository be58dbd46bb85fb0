"""The real chat REPL driven by typed keys."""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from localspec.frontends.chat import Repl
from localspec.frontends.conversation import Conversation, Session


class Interrupting(io.StringIO):
    """What the chat prints, which presses Ctrl-C (SIGINT) once `after` characters of a reply came out."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.sent = after, False

    def write(self, s: str) -> int:
        n = super().write(s)
        if not self.sent and len(self.getvalue()) >= self.after:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return n


def drive(
    conv: Conversation,
    keys: str,
    *,
    color: bool = False,
    history: Path | None = None,
    autosave: Path | Session | None = None,
    interrupt_after: int | None = None,
) -> str:
    """Type `keys` into a real Repl (\\r is Enter, \\x03 is Ctrl-C); return what it printed. `interrupt_after`:
    Ctrl-C once so many characters came out."""
    out = io.StringIO() if interrupt_after is None else Interrupting(interrupt_after)
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        repl = Repl(
            conv, out=out, color=color, history=history, autosave=autosave, pt_input=pipe, pt_output=DummyOutput()
        )
        repl.run()
    return out.getvalue()
