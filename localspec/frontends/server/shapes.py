"""The answers' shapes: what every endpoint's shape does (`Shape`), what chat and text completions' chunks
share (`Chunks`), usage and localspec's figures."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from localspec.api import Stats, TokenLogprob, ToolCall
from localspec.frontends.server.errors import ApiError

TokenBytes = Callable[[int], bytes]  # a token's bytes


@dataclass
class Served:
    """What a finished (or cut) generation reports."""

    text: str  # the content (without tool calls)
    stats: Stats
    seed: int
    prediction: tuple[int, int] | None  # (accepted, rejected) prediction tokens, OpenAI's way
    first_token: float  # seconds from the request's arrival to its first text
    finish_reason: str = "stop"
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: dict[str, Any] | None = None  # in the endpoint's shape


def token_text(piece: TokenBytes, token: int) -> tuple[str, list[int]]:
    """A token's text (invalid UTF-8 replaced) and its bytes."""
    raw = piece(token)
    return raw.decode("utf-8", "replace"), list(raw)


def usage(served: Served) -> dict[str, Any]:
    st = served.stats
    accepted, rejected = served.prediction or (0, 0)
    return {
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.completion_tokens,
        "total_tokens": st.prompt_tokens + st.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": st.cached_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
            "reasoning_tokens": 0,
        },
        "localspec": figures(served),
    }


def figures(served: Served) -> dict[str, Any]:
    """What localspec adds to usage: the seed, the drafting, the times."""
    st = served.stats
    return {
        "seed": served.seed,
        "drafted": st.drafted,
        "accepted": st.accepted,
        "target_passes": st.target_passes,
        "time_to_first_token": served.first_token,
        "prefill_seconds": st.prefill_seconds,
        "tokens_per_second": st.tokens_per_second,
        "drafted_by": st.drafted_by,
        "accepted_by": st.accepted_by,
    }


COMMENT = b": keepalive\n\n"  # an SSE comment: bytes on the wire, nothing for the client's parser


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event; `event` names it (the Responses API names each)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


class Shape(Protocol):
    """How one request's answer is shaped, whole or as a stream of events made as the generation goes: made per
    request, it holds the answer's id and its creation time."""

    rid: str
    now: int

    def headers(self) -> dict[str, str]:
        """Headers the answer carries beside the standard ones."""
        ...

    def logprobs(self, entries: list[TokenLogprob], piece: TokenBytes) -> dict[str, Any] | None:
        """The next tokens' log-probabilities in this endpoint's shape."""
        ...

    def final(self, served: Served) -> dict[str, Any]:
        """The whole answer."""
        ...

    def opening(self, prompt_tokens: int) -> list[bytes]:
        """The events before the first text (the prompt is `prompt_tokens` long)."""
        ...

    def delta(self, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        """The events for new text (and the log-probabilities of its tokens)."""
        ...

    def closing(self, served: Served) -> list[bytes]:
        """The events after the last text: tool calls, the finish, usage, the end."""
        ...

    def failure(self, error: ApiError) -> list[bytes]:
        """The events that end a stream whose generation failed."""
        ...

    def keepalive(self) -> list[bytes]:
        """What a stream sends while nothing comes (a long prefill): an event its clients take as one, or an SSE
        comment, which every parser skips."""
        ...


@dataclass
class Chunks:
    """What chat and text completions' shapes share: chunks, usage at the end where asked for, `[DONE]`. A
    subclass says its objects and what a choice holds."""

    model: str
    include_usage: bool = False
    rid: str = field(init=False)
    now: int = field(init=False)
    ID: ClassVar[str] = ""  # the id's prefix ...
    OBJECT: ClassVar[str] = ""  # ... the whole answer's object, and a chunk's
    CHUNK: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.rid, self.now = f"{self.ID}-{secrets.token_hex(12)}", int(time.time())

    def headers(self) -> dict[str, str]:
        return {}

    def choice(self, text: str | None, logprobs: dict[str, Any] | None, **delta: Any) -> dict[str, Any]:
        """A streamed choice's text (or delta) part."""
        raise NotImplementedError

    def whole(self, served: Served) -> dict[str, Any]:
        """The whole answer's choice, but its log-probabilities and finish."""
        raise NotImplementedError

    def chunk(self, choice: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, **choice, "finish_reason": finish}
        return sse(
            {"id": self.rid, "object": self.CHUNK, "created": self.now, "model": self.model, "choices": [choice]}
        )

    def opening(self, prompt_tokens: int) -> list[bytes]:
        return []

    def delta(self, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        return [self.chunk(self.choice(text, logprobs))] if text or logprobs else []

    def closing(self, served: Served) -> list[bytes]:
        out = [self.chunk(self.choice(None, None), served.finish_reason)]
        if self.include_usage:
            chunk = {"id": self.rid, "object": self.CHUNK, "created": self.now, "model": self.model}
            out.append(sse({**chunk, "choices": [], "usage": usage(served)}))
        return [*out, sse("[DONE]")]

    def failure(self, error: ApiError) -> list[bytes]:
        return [sse(error.body()), sse("[DONE]")]

    def keepalive(self) -> list[bytes]:
        return [COMMENT]

    def final(self, served: Served) -> dict[str, Any]:
        choice = {"index": 0, **self.whole(served), "logprobs": served.logprobs, "finish_reason": served.finish_reason}
        return {
            "id": self.rid,
            "object": self.OBJECT,
            "created": self.now,
            "model": self.model,
            "choices": [choice],
            "usage": usage(served),
        }
