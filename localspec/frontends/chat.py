"""`localspec chat`: the prompt-toolkit REPL over a Conversation."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TextIO

import numpy as np
from prompt_toolkit import PromptSession
from prompt_toolkit.completion import NestedCompleter
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings

from localspec.core.conversation import Conversation
from localspec.errors import LocalspecError
from localspec.runtime import draft_model_of
from localspec.limits import check

DRAFT_COLOR, RESET = "\x1b[36m", "\x1b[0m"
SETTABLE = ("k", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")
HELP = """commands:
  /help                 this help
  /set NAME VALUE       set k (a number or auto), temperature, top_p, top_k, min_p, max_tokens or seed
  /stats                last reply and session: tokens, tok/s, acceptance, tokens per pass, prefill
  /clear                start a new conversation (caches reset)
  /system TEXT          set the system prompt (starts a new conversation)
  /save FILE            save the conversation as JSON
  /load FILE            load a saved conversation (and prefill it)
  /color on|off         color accepted draft tokens (cyan) apart from the target's own
  /exit                 leave (Ctrl-D does too)
keys: Enter sends · Alt+Enter or Esc Enter adds a newline · Ctrl-C stops a reply or clears the line"""


class Exit(Exception):
    """Raised by /exit."""


def _keys() -> KeyBindings:
    kb = KeyBindings()

    @kb.add("escape", "enter")
    def _newline(event) -> None:
        event.current_buffer.insert_text("\n")

    return kb


class Repl:
    """Read a line, answer it or run a slash command, until /exit or Ctrl-D."""

    def __init__(self, conv: Conversation, *, out: TextIO | None = None, color: bool | None = None,
                 history: Path | None = None, autosave: Path | None = None, pt_input=None, pt_output=None) -> None:
        self.conv, self.autosave = conv, autosave
        self.out = out or sys.stdout
        self.color = self.out.isatty() if color is None else color
        if history is not None:
            history.parent.mkdir(parents=True, exist_ok=True)
        self.session: PromptSession = PromptSession(
            history=FileHistory(str(history)) if history else InMemoryHistory(),
            completer=NestedCompleter.from_nested_dict({
                "/help": None, "/set": {name: None for name in SETTABLE}, "/stats": None, "/clear": None,
                "/system": None, "/save": None, "/load": None, "/color": {"on": None, "off": None},
                "/exit": None}),
            key_bindings=_keys(), bottom_toolbar=self._toolbar, input=pt_input, output=pt_output)

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _say(self, line: str) -> None:
        self._write(line + "\n")

    def _toolbar(self) -> str:
        e = self.conv.engine
        draft = draft_model_of(e)
        names = e.target.name + (f" ← {draft.name}" if draft else " + copies" if e.drafters else " (no draft)")
        last = self.conv.last
        tail = ""
        if last and last.tokens_per_second:
            tail = f" · last {last.tokens_per_second:.1f} tok/s"
            if last.acceptance_rate is not None:
                tail += f", acceptance {last.acceptance_rate:.0%}"
        return f" {names} · k={'auto' if e.k is None else e.k} · T={e.sampler.temperature:g}{tail} "

    def run(self) -> None:
        """The read-answer loop."""
        while True:
            try:
                line = self.session.prompt("› ")
            except KeyboardInterrupt:  # Ctrl-C at the prompt clears the line
                continue
            except EOFError:
                return
            if not line.strip():
                continue
            try:
                if line.startswith("/"):
                    self.command(line.strip())
                else:
                    self.answer(line)
            except Exit:
                return
            except LocalspecError as e:
                self._say(f"error: {e}")

    def answer(self, text: str) -> None:
        """Stream a reply; Ctrl-C stops it and keeps what was said so far."""
        stream = self.conv.reply(text)
        for notice in self.conv.notices:
            self._say(notice)
        self.conv.notices.clear()
        try:
            for piece in stream:
                colored = self.color and piece.drafted
                self._write(f"{DRAFT_COLOR}{piece.text}{RESET}" if colored else piece.text)
        except KeyboardInterrupt:
            stream.close()
            self._write(" [interrupted]")
        finally:
            if self.autosave is not None:  # a crash or a killed terminal loses at most the reply in flight
                self.conv.save(self.autosave)
        self._write("\n")

    def command(self, line: str) -> None:
        """Run one slash command; a bad one raises LocalspecError (shown as one line)."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        conv, engine = self.conv, self.conv.engine
        if name == "/help":
            self._say(HELP)
        elif name == "/exit":
            raise Exit
        elif name == "/set":
            if len(arg.split()) != 2:
                _bad("usage: /set NAME VALUE")
            self._set(*arg.split())
        elif name == "/stats":
            self._say(f"last reply: {conv.last.summary()}" if conv.last else "last reply: none yet")
            self._say(f"session ({conv.replies} replies): {conv.totals.summary()}")
        elif name == "/clear":
            conv.clear()
            self._say("new conversation")
        elif name == "/system":
            if not arg:
                _bad("usage: /system TEXT")
            conv.system = arg
            conv.clear()
            conv.prefill()
            self._say("system prompt set; new conversation")
        elif name in ("/save", "/load"):
            if not arg:
                _bad(f"usage: {name} FILE")
            getattr(conv, name[1:])(Path(arg))
            self._say(f"{'saved' if name == '/save' else 'loaded'} {arg} ({len(conv.messages)} messages)")
        elif name == "/color":
            if arg not in ("on", "off"):
                _bad("usage: /color on|off")
            self.color = arg == "on"
        else:
            _bad(f"unknown command {name} (try /help)")

    def _set(self, name: str, raw: str) -> None:
        engine, conv = self.conv.engine, self.conv
        if name not in SETTABLE:
            _bad(f"cannot set {name!r}; settable: {', '.join(SETTABLE)}")
        if name == "k" and raw == "auto":
            if engine.cost is None:
                _bad("k auto needs the measured costs: start chat with --k auto (the default)")
            engine.k = None
            self._say("k = auto")
            return
        is_int = name in ("k", "top_k", "max_tokens", "seed")
        try:
            value = check(name, int(raw) if is_int else float(raw))
        except ValueError as e:
            _bad(f"{name}: {raw!r} is not valid ({e if 'must' in str(e) else 'not a number'})")
        if name == "k":
            if not engine.drafters and value > 0:
                _bad("nothing drafts (started with --no-draft)")
            engine.k = value
        elif name == "max_tokens":
            conv.max_tokens = value
        elif name == "seed":
            engine.rng = np.random.default_rng(value)
        else:
            engine.sampler = dataclasses.replace(engine.sampler, **{name: value})
        self._say(f"{name} = {value:g}")


def _bad(message: str) -> None:
    raise LocalspecError(message)
