"""`localspec chat`: the prompt-toolkit REPL over a Conversation."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import NestedCompleter
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings

from localspec.errors import LocalspecError
from localspec.files import atomic_file
from localspec.frontends.conversation import Conversation, Session, find_session, saved_sessions
from localspec.settings import CHAT_SETTABLE, SETTINGS

DRAFT_COLOR, RESET = "\x1b[36m", "\x1b[0m"
MAX_HISTORY = 1000  # lines of input history kept
KEYS_HELP = "keys: Enter sends · Alt+Enter or Esc Enter adds a newline · Ctrl-C stops a reply or clears the line"


@dataclass(frozen=True)
class Command:
    """A slash command: its help line, what it completes, and what it does with its argument."""

    name: str
    usage: str
    help: str
    run: Callable[[Repl, str], None]
    completes: dict[str, Any] | None = None


COMMANDS: dict[str, Command] = {}


def command(
    name: str, usage: str, help: str, completes: dict[str, Any] | None = None
) -> Callable[[Callable[[Repl, str], None]], Callable[[Repl, str], None]]:
    """Register a slash command (the /help text, completion and dispatch all come from COMMANDS)."""

    def register(run: Callable[[Repl, str], None]) -> Callable[[Repl, str], None]:
        COMMANDS[name] = Command(name, usage, help, run, completes)
        return run

    return register


def help_text() -> str:
    """The /help text: one line per command, then the keys."""
    lines = [f"  {c.name + (' ' + c.usage if c.usage else ''):21} {c.help}" for c in COMMANDS.values()]
    return "\n".join(["commands:", *lines, KEYS_HELP])


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

    def __init__(
        self,
        conv: Conversation,
        *,
        out: TextIO | None = None,
        color: bool | None = None,
        history: Path | None = None,
        autosave: Path | Session | None = None,
        pt_input=None,
        pt_output=None,
    ) -> None:
        self.conv = conv
        # where each turn is saved: a chat's Session, or a file given (held as a session's while it runs)
        self.file = autosave if autosave is None or isinstance(autosave, Session) else Session(autosave)
        self._owns_file = isinstance(autosave, Path)
        self.out = out or sys.stdout
        self.color = self.out.isatty() if color is None else color
        if history is not None:
            private_history(history)
        self.session: PromptSession = PromptSession(
            history=FileHistory(str(history)) if history else InMemoryHistory(),
            completer=NestedCompleter.from_nested_dict({c.name: c.completes for c in COMMANDS.values()}),
            key_bindings=_keys(),
            bottom_toolbar=self._toolbar,
            input=pt_input,
            output=pt_output,
        )

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _say(self, line: str) -> None:
        self._write(line + "\n")

    def _toolbar(self) -> str:
        conv = self.conv
        last = conv.last
        tail = ""
        if last and last.tokens_per_second:
            tail = f" · last {last.tokens_per_second:.1f} tok/s"
            if last.acceptance_rate is not None:
                tail += f", acceptance {last.acceptance_rate:.0%}"
        k = conv.spec.k
        temperature = conv.sampler.temperature
        return f" {conv.spec.pair} · k={'auto' if k is None else k} · T={temperature:g}{tail} "

    def run(self) -> None:
        """The read-answer loop (the file it was given to save to let go at its end)."""
        try:
            self._loop()
        finally:
            if self._owns_file and self.file is not None:
                self.file.release()

    def _loop(self) -> None:
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
            except (LocalspecError, ValueError) as e:  # ValueError: a setting the API refused, naming it
                self._say(f"error: {e}")
            except KeyboardInterrupt:  # while the history is tokenized or prefilled (/load): the session stays
                self._say("[interrupted]")

    def answer(self, text: str) -> None:
        """Stream a reply; Ctrl-C (or a signal that ends the chat) stops it and keeps what was said so far."""
        stream = self.conv.reply(text)
        for notice in self.conv.notices:
            self._say(notice)
        self.conv.notices.clear()
        try:
            for piece in stream:
                colored = self.color and piece.drafted
                self._write(f"{DRAFT_COLOR}{piece.text}{RESET}" if colored else piece.text)
        except KeyboardInterrupt:
            self._write(" [interrupted]")
        finally:  # however it stopped (a signal too), the reply so far joins the conversation, which is saved
            stream.close()
            self._write("\n")
            if self.file is not None:
                self.conv.save(self.file.path)

    def new_file(self, loaded: Path | None = None) -> None:
        """The conversation changed: a new one (/clear, /system) saves to a new file, a loaded one to its own
        file (a session's) or a new one; the file the last one was saved to stays as it is."""
        if self.file is not None:
            note = self.file.take() if loaded is None else self.file.continue_with(loaded)
            if note:
                self._say(note)

    def command(self, line: str) -> None:
        """Run one slash command; a bad one raises LocalspecError (shown as one line)."""
        name, _, arg = line.partition(" ")
        if name not in COMMANDS:
            _bad(f"unknown command {name} (try /help)")
        COMMANDS[name].run(self, arg.strip())


def private_history(path: Path, keep: int = MAX_HISTORY) -> None:
    """Make the input history file the user's alone (0600) and keep only its last `keep` entries
    (prompt_toolkit's format: each entry a "# time" line, then its "+" lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_APPEND, 0o600))
    os.chmod(path, 0o600)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("# ")]
    if len(starts) > keep:
        with atomic_file(path) as f:  # its temporary file, and so the history, is the user's alone
            f.writelines(["\n", *lines[starts[-keep] :]])


def _bad(message: str) -> NoReturn:
    raise LocalspecError(message)


@command("/help", "", "this help")
def _help(repl: Repl, arg: str) -> None:
    repl._say(help_text())


@command(
    "/set",
    "NAME VALUE",
    "set " + ", ".join(CHAT_SETTABLE[:-1]) + " or " + CHAT_SETTABLE[-1] + " (k: a number or auto)",
    {name: None for name in CHAT_SETTABLE},
)
def _set(repl: Repl, arg: str) -> None:
    if len(arg.split()) != 2:
        _bad("usage: /set NAME VALUE")
    name, raw = arg.split()
    conv = repl.conv
    if name not in CHAT_SETTABLE:
        _bad(f"cannot set {name!r}; settable: {', '.join(CHAT_SETTABLE)}")
    try:
        value = SETTINGS[name].parse(raw)
    except ValueError as e:
        _bad(f"{name}: {raw!r} is not valid ({e})")
    if name == "k":
        try:
            conv.spec.k = None if value == "auto" else int(value)  # type: ignore[arg-type]
        except ValueError as e:
            _bad(str(e))
    elif name == "max_tokens":
        conv.max_tokens = int(value)  # type: ignore[arg-type]
    elif name == "seed":
        conv.seed = int(value)  # type: ignore[arg-type]
    else:
        conv.sampler = dataclasses.replace(conv.sampler, **{name: value})  # type: ignore[arg-type]
    repl._say(f"{name} = {value if isinstance(value, str) else format(value, 'g')}")


@command("/stats", "", "last reply and session: tokens, tok/s, acceptance, tokens per pass, prefill, first token")
def _stats(repl: Repl, arg: str) -> None:
    conv = repl.conv
    repl._say(f"last reply: {conv.last.summary()}" if conv.last else "last reply: none yet")
    repl._say(f"session ({conv.replies} replies): {conv.totals.summary()}")


@command("/clear", "", "start a new conversation (caches reset)")
def _clear(repl: Repl, arg: str) -> None:
    repl.conv.clear()
    repl.new_file()
    repl._say("new conversation")


@command("/system", "TEXT", "set the system prompt (starts a new conversation)")
def _system(repl: Repl, arg: str) -> None:
    if not arg:
        _bad("usage: /system TEXT")
    repl.conv.system = arg
    repl.conv.clear()
    repl.new_file()
    repl.conv.prefill()
    repl._say("system prompt set; new conversation")


def _conversation_file(action: str, done: str) -> Callable[[Repl, str], None]:
    def run(repl: Repl, arg: str) -> None:
        if not arg:
            _bad(f"usage: /{action} FILE")
        getattr(repl.conv, action)(Path(arg))
        repl._say(f"{done} {arg} ({len(repl.conv.messages)} messages)")

    return run


command("/save", "FILE", "save the conversation as JSON")(_conversation_file("save", "saved"))


@command("/load", "FILE|NAME", "load a saved conversation, a file or a session's name (and prefill it)")
def _load(repl: Repl, arg: str) -> None:
    if not arg:
        _bad("usage: /load FILE|NAME")
    path = find_session(arg)
    repl.conv.load(path)
    repl.new_file(path)
    repl._say(f"loaded {path} ({len(repl.conv.messages)} messages)")


@command("/sessions", "", "the saved conversations, newest first (/load NAME or chat --resume NAME continues one)")
def _sessions(repl: Repl, arg: str) -> None:
    sessions = saved_sessions()
    if not sessions:
        repl._say("no saved conversations yet")
    for path in sessions[:20]:
        try:
            messages = json.loads(path.read_text(encoding="utf-8"))["messages"]
            first = next((str(m["content"]) for m in messages if m.get("role") == "user"), "")
            about = f"{len(messages)} messages · {' '.join(first.split())[:60]}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            about = "not a saved conversation"
        repl._say(f"  {path.stem}  {about}")


def _read(path: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        _bad(f"cannot read {path}: {getattr(e, 'strerror', None) or e}")


@command("/schema", "FILE|off", "every reply is JSON valid against this JSON schema (off: free text)")
def _schema(repl: Repl, arg: str) -> None:
    if not arg:
        _bad("usage: /schema FILE|off")
    if arg == "off":
        repl.conv.response_format = None
        repl._say("replies are free text")
        return
    try:
        schema = json.loads(_read(arg))
    except ValueError:
        _bad(f"{arg} is not JSON")
    form = {"type": "json_schema", "json_schema": {"name": Path(arg).stem, "schema": schema}}
    repl.conv.spec.check_response_format(form)  # a schema the grammar engine refuses: one line, now
    repl.conv.response_format = form
    repl._say(f"replies follow the schema in {arg}")


@command("/predict", "FILE", "the next reply is expected to repeat this file (an edit of it): drafted from it")
def _predict(repl: Repl, arg: str) -> None:
    if not arg:
        _bad("usage: /predict FILE")
    repl.conv.prediction = _read(arg)
    repl._say(f"the next reply is drafted from {arg}")


@command(
    "/color", "on|off", "color accepted draft tokens (cyan) apart from the target's own", {"on": None, "off": None}
)
def _color(repl: Repl, arg: str) -> None:
    if arg not in ("on", "off"):
        _bad("usage: /color on|off")
    repl.color = arg == "on"


@command("/exit", "", "leave (Ctrl-D does too)")
def _exit(repl: Repl, arg: str) -> None:
    raise Exit
