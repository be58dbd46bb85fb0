"""The answers' shapes: what every endpoint's shape does (`Shape`), chat and text completions' chunks and
usage."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from localspec.api import Stats, TokenLogprob, ToolCall
from localspec.frontends.server.errors import ApiError

Piece = Callable[[int], bytes]  # a token's bytes


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


def _token(piece: Piece, token: int) -> tuple[str, list[int]]:
    raw = piece(token)
    return raw.decode("utf-8", "replace"), list(raw)


def chat_logprobs(entries: list[TokenLogprob], piece: Piece) -> dict[str, Any]:
    """Chat completions' logprobs: each token with its bytes and its most likely alternatives."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        text, raw = _token(piece, token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content = [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], piece: Piece, offset: int = 0) -> dict[str, Any]:
    """Text completions' (legacy) logprobs: parallel lists, alternatives as {token: logprob}."""
    tokens = [_token(piece, e.token)[0] for e in entries]
    offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_token(piece, t)[0]: lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


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


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event; `event` names it (the Responses API names each)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


class Shape(Protocol):
    """How one endpoint answers: whole, or as a stream of events made as the generation goes."""

    def new_id(self) -> str: ...

    def headers(self) -> dict[str, str]:
        """Headers the answer carries beside the standard ones."""
        ...

    def logprobs(self, entries: list[TokenLogprob], piece: Piece) -> dict[str, Any] | None:
        """The next tokens' log-probabilities in this endpoint's shape."""
        ...

    def final(self, rid: str, now: int, served: Served) -> dict[str, Any]:
        """The whole answer."""
        ...

    def opening(self, rid: str, now: int) -> list[bytes]:
        """The events before the first text."""
        ...

    def delta(self, rid: str, now: int, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        """The events for new text (and the log-probabilities of its tokens)."""
        ...

    def closing(self, rid: str, now: int, served: Served) -> list[bytes]:
        """The events after the last text: tool calls, the finish, usage, the end."""
        ...

    def failure(self, rid: str, now: int, error: ApiError) -> list[bytes]:
        """The events that end a stream whose generation failed."""
        ...


@dataclass
class Completions:
    """Chat completions' or text completions' shapes (`chat`), streamed usage where asked for."""

    chat: bool
    model: str
    include_usage: bool = False
    offset: int = 0  # characters whose log-probabilities went out (text completions' text_offset)

    def logprobs(self, entries: list[TokenLogprob], piece: Piece) -> dict[str, Any] | None:
        if self.chat:
            return chat_logprobs(entries, piece)
        out = completion_logprobs(entries, piece, self.offset)
        self.offset += sum(len(t) for t in out["tokens"])
        return out

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def new_id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{secrets.token_hex(12)}"

    def headers(self) -> dict[str, str]:
        return {}

    def chunk(
        self,
        rid: str,
        now: int,
        text: str | None,
        finish: str | None,
        *,
        role: bool = False,
        logprobs: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return {"id": rid, "object": self.chunk_object, "created": now, "model": self.model, "choices": [choice]}

    def opening(self, rid: str, now: int) -> list[bytes]:
        return [sse(self.chunk(rid, now, None, None, role=True))] if self.chat else []

    def delta(self, rid: str, now: int, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        return [sse(self.chunk(rid, now, text, None, logprobs=logprobs))] if text or logprobs else []

    def closing(self, rid: str, now: int, served: Served) -> list[bytes]:
        out = [sse(self.chunk(rid, now, None, None, tool_calls=d)) for d in call_deltas(served.tool_calls)]
        out.append(sse(self.chunk(rid, now, None, served.finish_reason)))
        if self.include_usage:
            chunk = {"id": rid, "object": self.chunk_object, "created": now, "model": self.model}
            out.append(sse({**chunk, "choices": [], "usage": usage(served)}))
        return [*out, sse("[DONE]")]

    def failure(self, rid: str, now: int, error: ApiError) -> list[bytes]:
        return [sse(error.body()), sse("[DONE]")]

    def final(self, rid: str, now: int, served: Served) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": served.text or None}
            if served.tool_calls:
                message["tool_calls"] = [c.openai() for c in served.tool_calls]
            else:
                message["content"] = served.text
            choice: dict[str, Any] = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": served.text}
        choice |= {"logprobs": served.logprobs, "finish_reason": served.finish_reason}
        return {
            "id": rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": now,
            "model": self.model,
            "choices": [choice],
            "usage": usage(served),
        }


def call_deltas(calls: list[ToolCall]) -> list[list[dict[str, Any]]]:
    """Streamed tool calls as OpenAI sends them: per call, its id and name, then its arguments."""
    out = []
    for i, c in enumerate(calls):
        out.append([{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}])
        out.append([{"index": i, "function": {"arguments": c.arguments}}])
    return out
