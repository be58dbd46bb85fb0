"""The response shapes: whole answers, stream chunks and usage, for chat and text completions."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localspec.api import Stats, TokenLogprob, ToolCall

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
        "prompt_tokens_details": {"cached_tokens": st.prompt_tokens - st.prefill_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
            "reasoning_tokens": 0,
        },
        "localspec": {
            "seed": served.seed,
            "drafted": st.drafted,
            "accepted": st.accepted,
            "target_passes": st.target_passes,
            "time_to_first_token": served.first_token,
            "prefill_seconds": st.prefill_seconds,
            "tokens_per_second": st.tokens_per_second,
            "drafted_by": st.drafted_by,
            "accepted_by": st.accepted_by,
        },
    }


def sse(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


@dataclass(frozen=True)
class Shape:
    """How one endpoint's responses look: chat completions or text completions."""

    chat: bool
    model: str

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

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
