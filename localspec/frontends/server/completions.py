"""POST /v1/completions (text completions, fill-in-the-middle with `suffix`): its request, its shape, its route."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from fastapi import APIRouter, Request
from pydantic import Field, field_validator

from localspec.api import MAX_LOGPROBS, TokenLogprob
from localspec.frontends.server.errors import ApiError
from localspec.frontends.server.schemas import RequestBase
from localspec.frontends.server.service import Service
from localspec.frontends.server.shapes import Chunks, Served, TokenBytes, token_text

DEFAULT_MAX_TOKENS = 16  # OpenAI's, for text completions


class CompletionRequest(RequestBase):
    PROMPT_FIELD: ClassVar[str] = "prompt"
    RAW: ClassVar[bool] = True
    prompt: str | list[str]
    suffix: str | None = None  # fill-in-the-middle
    logprobs: Annotated[int | None, Field(ge=0, le=MAX_LOGPROBS)] = None  # alternatives per token
    echo: bool = False

    def check(self) -> None:
        self.refuse_unsupported()
        if self.echo:
            raise ApiError(400, "localspec does not support 'echo'", param="echo", code="unsupported_parameter")

    def options(self) -> dict[str, Any]:
        return {
            "response_format": self.response_format.openai() if self.response_format else None,
            "logprobs": self.logprobs,
            "suffix": self.suffix or None,
        }

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt per request")
        return v

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def completion_logprobs(entries: list[TokenLogprob], piece: TokenBytes, offset: int = 0) -> dict[str, Any]:
    """Text completions' (legacy) logprobs: parallel lists, alternatives as {token: logprob}."""
    tokens = [token_text(piece, e.token)[0] for e in entries]
    offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{token_text(piece, t)[0]: lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


@dataclass
class TextShape(Chunks):
    """Text completions' answer: the text, or chunks of it, log-probabilities in the legacy parallel lists."""

    ID: ClassVar[str] = "cmpl"
    OBJECT: ClassVar[str] = "text_completion"
    CHUNK: ClassVar[str] = "text_completion"
    offset: int = 0  # characters whose log-probabilities went out (text_offset)

    def logprobs(self, entries: list[TokenLogprob], piece: TokenBytes) -> dict[str, Any] | None:
        out = completion_logprobs(entries, piece, self.offset)
        self.offset += sum(len(t) for t in out["tokens"])
        return out

    def choice(self, text: str | None, logprobs: dict[str, Any] | None, **delta: Any) -> dict[str, Any]:
        return {"text": text or "", "logprobs": logprobs}

    def whole(self, served: Served) -> dict[str, Any]:
        return {"text": served.text}


def add_route(router: APIRouter, service: Service) -> None:
    @router.post("/completions")
    async def completions(request: Request, req: CompletionRequest) -> Any:
        shape = TextShape(service.model_id, req.include_usage())
        return await service.serve(request, req, shape, req.text(), req.max_tokens or DEFAULT_MAX_TOKENS)
