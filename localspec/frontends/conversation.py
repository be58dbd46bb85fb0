"""A chat conversation on the public API: turns, the cache kept across turns, context overflow, save and load.

Each reply is a `LocalSpec.generate` of the conversation so far; the target's cache keeps the longest common
prefix, so a turn decodes only its new message, and an assistant reply is fed back as the tokens it was sampled
as. A conversation longer than the context keeps every turn: only what the model is shown (its window, from a
user turn to the end) leaves the oldest out.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from localspec.api import Generation, LocalSpec, Message, Piece, SamplerSettings, Stats
from localspec.errors import LocalspecError
from localspec.files import locked, write_json
from localspec.paths import data_dir
from localspec.settings import default

SAVE_VERSION = 1
LATEST = "latest"  # `--resume` alone: the newest saved conversation


def sessions_dir() -> Path:
    """Where each chat saves its conversation, a file of its own."""
    return data_dir() / "conversations"


def new_session() -> Path:
    """A new chat's own file, named by its start and a random tag: two chats never share one."""
    return sessions_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}.json"


class Session:
    """The file a chat saves its conversation to, held while the chat writes to it (a lock beside it): two chats never
    write one file, and a new conversation (/clear, /system) or another one loaded gets a file of its own, so no
    saved conversation is ever overwritten by another."""

    def __init__(self, path: Path | None = None) -> None:
        self.path: Path = new_session()
        self._held: FileLock | None = None
        self.note = self.take(path)

    def take(self, path: Path | None = None) -> str | None:
        """Save to `path` from now on (None: a new session's file); where another chat holds it, a new file, and
        a line that says so."""
        self.release()
        note = None
        if path is not None:
            if (held := _hold(path)) is None:
                note = f"{path.name} is open in another chat: this one goes on in a new session's file"
            else:
                self.path, self._held = path, held
                return None
        self.path = new_session()
        self._held = _hold(self.path)
        return note

    def continue_with(self, path: Path) -> str | None:
        """A loaded conversation: a session's own file is continued (where no other chat holds it), any other
        file is copied into a new session's."""
        return self.take(path if path.parent == sessions_dir() else None)

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None


def _hold(path: Path) -> FileLock | None:
    """The chat's hold on a session file (None where another chat has it)."""
    lock = locked(path.with_name(path.name + ".open"), timeout=0)
    try:
        lock.acquire()
    except (Timeout, OSError):
        return None
    return lock


def saved_sessions() -> list[Path]:
    """The saved conversations, newest first."""
    return sorted(sessions_dir().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)


def find_session(name: str) -> Path:
    """The saved conversation `name` means: LATEST (the newest), a file, or the start of a session's name."""
    sessions = saved_sessions()
    if name == LATEST:
        if not sessions:
            raise LocalspecError(f"no saved conversation to resume (none in {sessions_dir()})")
        return sessions[0]
    if (path := Path(name).expanduser()).is_file():
        return path
    matches = [p for p in sessions if p.stem.startswith(name)]
    if len(matches) != 1:
        why = f"{len(matches)} match it" if matches else f"/sessions lists them; they are in {sessions_dir()}"
        raise LocalspecError(f"no one saved conversation named {name!r} ({why})")
    return matches[0]


@dataclass
class Conversation:
    """Messages and the loaded pair that answers them, with the conversation's own sampler settings (the pair's
    loaded ones to start with, changed by /set) and seed (None: the pair's, else one drawn for the conversation)."""

    spec: LocalSpec
    system: str | None = None
    max_tokens: int = default("max_tokens", "chat")
    seed: int | None = None
    response_format: dict | None = None  # OpenAI's: every reply follows it (a JSON schema, say)
    prediction: str | None = None  # text the next reply is expected to repeat (used once)
    messages: list[Message] = field(default_factory=list)
    totals: Stats = field(default_factory=Stats)  # summed over the session's replies
    replies: int = 0
    notices: list[str] = field(default_factory=list)  # one-line messages for the user (e.g. turns dropped)
    last: Stats | None = None  # the last reply's figures
    start: int = 0  # the first message the model is shown (older ones stay in the conversation, not in the window)
    sampler: SamplerSettings = field(init=False)

    def __post_init__(self) -> None:
        self.sampler = self.spec.config.sampler
        if self.seed is None:
            self.seed = self.spec.config.seed if self.spec.config.seed is not None else secrets.randbelow(2**31)

    def _rendered(self, messages: list[Message]) -> list[int]:
        return self.spec.tokens(messages, system=self.system)

    def _fit(self, user: Message) -> list[Message]:
        """The messages of the next reply's prompt: the window, and `user`. A message that cannot fit even alone
        is refused (LocalspecError), the conversation as it was."""
        n_ctx = self.spec.n_ctx
        window = [*self.window, user]
        if len(self._rendered(window)) + self._room <= n_ctx:  # it fits as it is: one rendering, the common case
            return window
        alone = len(self._rendered([user]))
        if alone >= n_ctx:
            raise LocalspecError(
                f"this message needs {alone} tokens and the context holds {n_ctx} ({alone - n_ctx + 1} too many); "
                "the conversation is kept as it was"
            )
        return [*self._slide([user]), user]

    @property
    def _room(self) -> int:
        return min(self.max_tokens, self.spec.n_ctx // 2)

    @property
    def window(self) -> list[Message]:
        """The messages the model is shown: the conversation from `start` on."""
        return self.messages[self.start :]

    def _slide(self, after: list[Message]) -> list[Message]:
        """Move the window's start past the oldest turns until it and `after` fit with room to answer, and say
        so; once it must move, it moves down to half the context, so the re-decoding of the turns it keeps
        (their cache positions shift) happens once every few turns rather than at every turn. The start is found
        by halving among the turns (a resumed conversation of a thousand turns renders a dozen times, not a
        thousand)."""
        n_ctx, messages = self.spec.n_ctx, self.messages

        def fits(start: int, limit: int) -> bool:
            return len(self._rendered([*messages[start:], *after])) + self._room <= limit

        if not self.window or fits(self.start, n_ctx):
            return self.window
        # where it may start: each later user turn, then nowhere (an empty window always does)
        starts = [i for i in range(self.start + 1, len(messages)) if messages[i]["role"] == "user"] + [len(messages)]
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(starts[mid], n_ctx // 2) else (mid + 1, hi)
        self.start, left = starts[lo], lo + 1
        self.notices.append(
            f"context full: the {left} oldest turn{'s are' if left > 1 else ' is'} left out of what the model "
            "sees (the conversation and its file keep every turn; the system prompt stays)"
        )
        return self.window

    def reply(self, text: str) -> Generator[Piece, None, None]:
        """Fit the prompt (notices say what was dropped), then stream the assistant's reply to `text`.

        The reply, even a partial one cut by Ctrl-C, joins the conversation with its sampled tokens.
        """
        user = {"role": "user", "content": text}
        prompt = self._fit(user)
        self.messages.append(user)
        run = self.spec.generate(
            prompt,
            system=self.system,
            max_tokens=self.max_tokens,
            sampler=self.sampler,
            seed=self.seed,
            response_format=self.response_format,
            prediction=self.prediction,
        )
        self.prediction = None
        return self._stream(run)

    def _stream(self, run: Generation) -> Generator[Piece, None, None]:
        pieces = iter(run)
        try:
            yield from pieces
        finally:
            pieces.close()  # ends the generation: its figures and tokens are complete
            self.messages.append({"role": "assistant", "content": run.text, "tokens": run.tokens})
            self.totals.add(run.stats)
            self.replies += 1
            self.last = run.stats

    def clear(self) -> None:
        """A new conversation: no messages, empty caches."""
        self.messages.clear()
        self.start = 0
        self.spec.reset()

    def prefill(self) -> None:
        """Decode the conversation so far into the target's cache (after /load or /system), as much of it as the
        model will be shown with room to answer. A draft model catches up only when it next drafts."""
        if self.messages or self.system:
            self.spec.prefill(self._slide([]), system=self.system)

    def to_json(self) -> dict:
        return {
            "version": SAVE_VERSION,
            "system": self.system,
            "messages": [{"role": m["role"], "content": m["content"]} for m in self.messages],
        }

    def save(self, path: Path) -> None:
        """Write the conversation as JSON (atomically, under the file's lock: never half a file)."""
        path = Path(path).expanduser()
        try:
            with locked(path):  # two chats saving to one file: each write whole, one after the other
                write_json(path, self.to_json())
        except (OSError, Timeout) as e:
            raise LocalspecError(f"cannot save to {path}: {getattr(e, 'strerror', None) or e}") from None

    def load(self, path: Path) -> None:
        """Replace the conversation with one saved by save(), and prefill it."""
        path = Path(path).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            messages = [{"role": str(m["role"]), "content": _text(m["content"])} for m in data["messages"]]
            system = data.get("system")
        except OSError as e:
            raise LocalspecError(f"cannot read {path}: {e.strerror}") from None
        except (ValueError, KeyError, TypeError, RecursionError):
            raise LocalspecError(f"{path} is not a saved localspec conversation") from None
        if any(m["role"] not in ("user", "assistant") for m in messages):
            raise LocalspecError(f"{path}: messages must be from 'user' or 'assistant'")
        self.system, self.messages, self.start = (str(system) if system else None), messages, 0
        self.prefill()


def _text(content: object) -> str:
    """A saved message's text: a string, or none (null); TypeError for anything else."""
    if content is None:
        return ""
    if not isinstance(content, str):
        raise TypeError("a message's content is text")
    return content
