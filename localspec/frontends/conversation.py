"""A chat conversation on the public API: turns, the cache kept across turns, context overflow, save and load.

Each reply is a `LocalSpec.generate` of the whole conversation so far; the target's cache keeps the longest
common prefix, so a turn decodes only its new message, and an assistant reply is fed back as the tokens it
was sampled as.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path

from filelock import Timeout

from localspec.api import Generation, LocalSpec, Message, Piece, SamplerSettings, Stats
from localspec.errors import LocalspecError
from localspec.files import locked, write_json

SAVE_VERSION = 1


@dataclass
class Conversation:
    """Messages and the loaded pair that answers them, with the conversation's own sampler settings and seed
    (None: the pair's loaded defaults, and a seed drawn once for the conversation)."""

    spec: LocalSpec
    system: str | None = None
    max_tokens: int = 1024
    sampler: SamplerSettings | None = None
    seed: int | None = None
    response_format: dict | None = None  # OpenAI's: every reply follows it (a JSON schema, say)
    prediction: str | None = None  # text the next reply is expected to repeat (used once)
    messages: list[Message] = field(default_factory=list)
    totals: Stats = field(default_factory=Stats)  # summed over the session's replies
    replies: int = 0
    notices: list[str] = field(default_factory=list)  # one-line messages for the user (e.g. turns dropped)
    last: Stats | None = None  # the last reply's figures

    def __post_init__(self) -> None:
        if self.sampler is None:
            self.sampler = self.spec.config.sampler
        if self.seed is None:
            self.seed = self.spec.config.seed if self.spec.config.seed is not None else secrets.randbelow(2**31)

    def _rendered(self, messages: list[Message]) -> list[int]:
        return self.spec.tokens(messages, system=self.system)

    def _fit(self, user: Message) -> list[Message]:
        """The messages of the next reply's prompt, dropping the oldest turns when it would not fit with room
        to answer.

        A message that cannot fit even alone is refused (LocalspecError) before any turn is dropped. When it
        must drop, it drops down to half the context, so the re-decoding of the kept turns (their cache
        positions shift) happens once every few turns rather than at every turn.
        """
        n_ctx = self.spec.n_ctx
        room = min(self.max_tokens, n_ctx // 2)
        needed = len(self._rendered([*self.messages, user]))
        if needed + room <= n_ctx:  # it fits as it is: one rendering, the common case
            return [*self.messages, user]
        alone = len(self._rendered([user])) if self.messages else needed
        if alone >= n_ctx:
            raise LocalspecError(
                f"this message needs {alone} tokens and the context holds {n_ctx} ({alone - n_ctx + 1} too many); "
                "the conversation is kept as it was"
            )
        dropped, limit = 0, n_ctx
        while len(self._rendered([*self.messages, user])) + room > limit and self.messages:
            limit = n_ctx // 2
            cut = next((i for i, m in enumerate(self.messages[1:], 1) if m["role"] == "user"), len(self.messages))
            del self.messages[:cut]
            dropped += 1
        if dropped:
            self.notices.append(
                f"context full: dropped the {dropped} oldest turn{'s' * (dropped > 1)} (the system prompt stays)"
            )
        return [*self.messages, user]

    def reply(self, text: str) -> Generator[Piece, None, None]:
        """Fit the prompt (notices say what was dropped), then stream the assistant's reply to `text`.

        The reply, even a partial one cut by Ctrl-C, joins the conversation with its sampled tokens.
        """
        user = {"role": "user", "content": text}
        prompt = self._fit(user)
        self.messages.append(user)
        s = self.sampler or SamplerSettings()
        run = self.spec.generate(
            prompt,
            system=self.system,
            max_tokens=self.max_tokens,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            min_p=s.min_p,
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
        self.spec.reset()

    def prefill(self) -> None:
        """Decode the conversation so far into the target's cache (after /load or /system); a longer one than
        the context is cut to fit at the next reply. A draft model catches up only when it next drafts."""
        if self.messages or self.system:
            self.spec.prefill(self.messages, system=self.system)

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
