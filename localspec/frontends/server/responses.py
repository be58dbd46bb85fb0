"""The response shapes: whole answers, stream chunks and usage, for chat and text completions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localspec.core.stats import Stats


@dataclass
class Served:
    """What a finished (or cut) generation reports."""

    text: str
    stats: Stats
    seed: int
    prediction: tuple[int, int] | None  # (accepted, rejected) prediction tokens, OpenAI's way
    first_token: float  # seconds from the request's arrival to its first text


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

    def chunk(self, rid: str, now: int, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": self.chunk_object, "created": now, "model": self.model, "choices": [choice]}

    def final(self, rid: str, now: int, served: Served) -> dict[str, Any]:
        reason = finish(served.stats)
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": served.text},
                "logprobs": None,
                "finish_reason": reason,
            }
        else:
            choice = {"index": 0, "text": served.text, "logprobs": None, "finish_reason": reason}
        return {
            "id": rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": now,
            "model": self.model,
            "choices": [choice],
            "usage": usage(served),
        }


def finish(st: Stats) -> str:
    return "length" if st.finish_reason == "length" else "stop"
