"""A chat conversation on the engine: turns, KV reuse across turns, context overflow, save/load."""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path

from filelock import Timeout

from localspec.core.stats import Piece, Stats
from localspec.decoding.engine import Engine
from localspec.errors import LocalspecError
from localspec.files import locked, write_json
from localspec.llama.template import Message, chat_tokens

SAVE_VERSION = 1


@dataclass
class Conversation:
    """Messages plus the engine that answers them; the caches keep the conversation between turns."""

    engine: Engine
    system: str | None = None
    max_tokens: int = 1024
    messages: list[Message] = field(default_factory=list)
    totals: Stats = field(default_factory=Stats)  # summed over the session's replies
    replies: int = 0
    notices: list[str] = field(default_factory=list)  # one-line messages for the user (e.g. turns dropped)
    last: Stats | None = None  # the last reply's figures

    def _rendered(self, messages: list[Message], generation: bool = True) -> list[int]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return chat_tokens(self.engine.target, system + messages, add_generation_prompt=generation)

    def _fit(self, user: Message) -> list[int]:
        """The prompt for the next reply, dropping the oldest turns when it would not fit with room to answer.

        A message that cannot fit even alone is refused (LocalspecError) before any turn is dropped. When it
        must drop, it drops down to half the context, so the re-decoding of the kept turns (their cache
        positions shift) happens once every few turns rather than at every turn.
        """
        n_ctx = self.engine.target.n_ctx
        alone = len(self._rendered([user]))
        if alone >= n_ctx:
            raise LocalspecError(
                f"this message needs {alone} tokens and the context holds {n_ctx} ({alone - n_ctx + 1} too many); "
                "the conversation is kept as it was"
            )
        room = min(self.max_tokens, n_ctx // 2)
        dropped, limit = 0, n_ctx
        while True:
            prompt = self._rendered([*self.messages, user])
            if len(prompt) + room <= limit or not self.messages:
                break
            limit = n_ctx // 2
            cut = next((i for i, m in enumerate(self.messages[1:], 1) if m["role"] == "user"), len(self.messages))
            del self.messages[:cut]
            dropped += 1
        if dropped:
            self.notices.append(
                f"context full: dropped the {dropped} oldest turn{'s' * (dropped > 1)} (the system prompt stays)"
            )
        return prompt

    def reply(self, text: str) -> Generator[Piece, None, None]:
        """Fit the prompt (notices say what was dropped), then stream the assistant's reply to `text`.

        The reply, even a partial one cut by Ctrl-C, joins the conversation with its sampled tokens.
        """
        user = {"role": "user", "content": text}
        prompt = self._fit(user)
        self.messages.append(user)
        return self._stream(prompt)

    def _stream(self, prompt: list[int]) -> Generator[Piece, None, None]:
        pieces: list[str] = []
        stats, tokens = Stats(), list[int]()
        try:
            for piece in self.engine.generate(prompt, self.max_tokens, stats=stats, completion=tokens):
                pieces.append(piece.text)
                yield piece
        finally:
            self.messages.append({"role": "assistant", "content": "".join(pieces), "tokens": tokens})
            self.totals.add(stats)
            self.replies += 1
            self.last = stats

    def clear(self) -> None:
        """A new conversation: no messages, empty caches."""
        self.messages.clear()
        self.engine.target.reset()
        for d in self.engine.drafters:
            d.reset()

    def prefill(self) -> None:
        """Decode the conversation so far into the target's cache (after /load or /system).

        A draft model catches up only when it next drafts (the planner prices that in)."""
        tokens = self._rendered(self.messages, generation=False) if self.messages or self.system else []
        if 0 < len(tokens) < self.engine.target.n_ctx:  # a longer one is cut to fit at the next reply
            self.engine.target.sync(tokens, 0)

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
            data = json.loads(path.read_text())
            messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in data["messages"]]
            system = data.get("system")
        except OSError as e:
            raise LocalspecError(f"cannot read {path}: {e.strerror}") from None
        except (ValueError, KeyError, TypeError):
            raise LocalspecError(f"{path} is not a saved localspec conversation") from None
        if any(m["role"] not in ("user", "assistant") for m in messages):
            raise LocalspecError(f"{path}: messages must be from 'user' or 'assistant'")
        self.system, self.messages = (str(system) if system else None), messages
        self.prefill()
