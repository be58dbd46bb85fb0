"""The request bodies: every field typed and ranged, so a bad one becomes a 400 naming it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from localspec.frontends.server.errors import ApiError
from localspec.settings import SETTINGS

MAX_STOP_LENGTH = 256  # the stop matcher looks back this far at every token


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class Prediction(BaseModel):
    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class RequestBase(BaseModel):
    """Fields that chat and text completions share."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: Annotated[int | None, Field(ge=1)] = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("temperature", "top_p", "top_k", "min_p", "seed")
    @classmethod
    def _in_range(cls, v: Any, info: ValidationInfo) -> Any:
        """The ranges of the settings table (the same as the command line's)."""
        return v if v is None else SETTINGS[str(info.field_name)].check(v)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")  # OpenAI's limit
        if any(len(s) > MAX_STOP_LENGTH for s in ([v] if isinstance(v, str) else v or [])):
            raise ValueError(f"a stop sequence may be at most {MAX_STOP_LENGTH} characters")  # the matcher's bound
        return v

    def refuse_unsupported(self) -> None:
        """Fields that would change the answer in ways localspec does not implement: a 400 naming each."""
        unsupported = {
            "n": self.n not in (None, 1),
            "logprobs": bool(self.logprobs),
            "top_logprobs": bool(self.top_logprobs),
            "frequency_penalty": bool(self.frequency_penalty),
            "presence_penalty": bool(self.presence_penalty),
            "logit_bias": bool(self.logit_bias),
            "tools": bool(self.tools),
            "functions": bool(self.functions),
            "response_format": bool(self.response_format) and (self.response_format or {}).get("type") != "text",
        }
        for field, present in unsupported.items():
            if present:
                raise ApiError(
                    400,
                    f"localspec does not support '{field}' (it would change the answer)",
                    param=field,
                    code="unsupported_parameter",
                )

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(RequestBase):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int | None, Field(ge=1)] = None
    prediction: Prediction | None = None


class CompletionRequest(RequestBase):
    prompt: str | list[str]
    prediction: Prediction | None = None  # an extension: the same draft source for raw completions

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt per request")
        return v

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]
