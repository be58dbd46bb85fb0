"""The request bodies: every field typed and ranged, so a bad one becomes a 400 naming it."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from localspec.api import ANY_JSON_OBJECT, HOLD_SECONDS, MAX_LOGPROBS, json_schema_grammar
from localspec.frontends.server.errors import ApiError
from localspec.settings import SETTINGS

MAX_STOP_LENGTH = 256  # the stop matcher looks back this far at every token
MAX_MESSAGES = 4096  # a conversation longer than any context holds; beyond it, a body is refused before templating
MAX_TOOLS = 256
MAX_CACHE_KEY = 1024
DAY = 86400.0


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = ""


class ToolCallMessage(BaseModel):
    """A call the assistant made, as a client sends it back in the history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallMessage] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it (developer is system; calls and tool results kept)."""
        m: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            m["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            m["name"] = self.name
        return m


class FunctionDef(BaseModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            json_schema_grammar(v, lenient=True)  # a GrammarError (a ValueError) names what is wrong
        return v


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class ToolChoiceFunction(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str = "response"
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("a json_schema response format needs its json_schema")
            json_schema_grammar(self.json_schema.schema_ or ANY_JSON_OBJECT)
        return self

    def openai(self) -> dict[str, Any]:
        """As LocalSpec.generate takes it."""
        return self.model_dump(by_alias=True, exclude_none=True)


class Prediction(BaseModel):
    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class Common(BaseModel):
    """What every generating endpoint takes: the model, sampling, streaming, the drafting cap, a prediction."""

    model_config = ConfigDict(extra="ignore")
    model: str
    # the fields a refusal names: where the prompt is, and the cap on the answer's length
    PROMPT_FIELD: ClassVar[str] = "messages"
    LENGTH_FIELD: ClassVar[str] = "max_tokens"
    RAW: ClassVar[bool] = False  # whether its prompt is text as it is (not messages through the chat template)
    ANY_MODEL: ClassVar[bool] = False  # whether any model name is answered by the one served
    CAP_TO_ROOM: ClassVar[bool] = False  # whether a length cap beyond the context's room is answered up to the room

    @model_validator(mode="before")
    @classmethod
    def _representable(cls, data: Any) -> Any:
        """Refuse what no field could hold (`unrepresentable`): it could not be tokenized, logged or echoed."""
        if problem := unrepresentable(data):
            raise ValueError(f"the request holds {problem}")
        return data

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stream: bool = False
    prediction: Prediction | None = None  # OpenAI's Predicted Outputs (an extension beyond chat completions)
    # llama-server's per-request drafting cap: the most tokens a round drafts (0: the target alone)
    speculative_n_max: Annotated[int | None, Field(ge=0, le=64, alias="speculative.n_max")] = None
    # OpenAI's name for a conversation (Codex sends its id), and how long its cached prefix should last
    prompt_cache_key: Annotated[str | None, Field(max_length=MAX_CACHE_KEY)] = None
    prompt_cache_retention: Literal["in_memory", "in-memory", "24h"] | None = None

    @field_validator("temperature", "top_p", "top_k", "min_p", "seed")
    @classmethod
    def _in_range(cls, v: Any, info: ValidationInfo) -> Any:
        """The ranges of the settings table (the same as the command line's)."""
        return v if v is None else SETTINGS[str(info.field_name)].check(v)

    def check(self) -> None:
        """What no single field shows (a 400 naming the field)."""

    def stops(self) -> list[str]:
        return []

    def options(self) -> dict[str, Any]:
        """Options' fields for what this request asks beyond sampling."""
        return {}

    def cache(self) -> dict[str, Any]:
        """Options' cache key and hold: `prompt_cache_key`'s newest entry is held from eviction until the key goes
        unused for ten minutes (a day with `prompt_cache_retention` "24h")."""
        if self.prompt_cache_key is None:
            return {}
        hold = DAY if self.prompt_cache_retention == "24h" else HOLD_SECONDS
        return {"cache_key": f"openai:{self.prompt_cache_key}", "cache_hold": hold}


class RequestBase(Common):
    """Fields that chat and text completions share."""

    max_tokens: Annotated[int | None, Field(ge=1)] = None
    stop: str | list[str] | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    top_logprobs: Annotated[int | None, Field(ge=0, le=MAX_LOGPROBS)] = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    functions: list[Any] | None = None
    response_format: ResponseFormat | None = None

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
            "frequency_penalty": bool(self.frequency_penalty),
            "presence_penalty": bool(self.presence_penalty),
            "logit_bias": bool(self.logit_bias),
            "functions": bool(self.functions),
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

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def check_named_tool(name: str | None, names: list[str]) -> None:
    """A tool_choice that names a function must name one of the tools, and "required" (`name` None) needs one (a
    400 naming tool_choice, as OpenAI answers)."""
    if name is None and not names:
        raise ApiError(400, "tool_choice is 'required' but no tools are given", param="tool_choice")
    if name is not None and name not in names:
        raise ApiError(
            400,
            f"tool_choice names the function '{name}', which is not among the tools ({', '.join(names) or 'none given'})",
            param="tool_choice",
        )


_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_NESTING = 128  # levels of objects and arrays a request may nest (OpenAI's own bodies nest a dozen)


def unrepresentable(value: Any) -> str | None:
    """What in a parsed JSON body no field can hold, said as "the request holds ...": text that is not Unicode (a
    lone surrogate, which JSON's escapes allow), a number JSON has no name for (NaN, Infinity: Python's parser reads
    them), or nesting deeper than MAX_NESTING. None: nothing. Walked without recursion, so no depth overflows it."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return "text that is not Unicode (a lone surrogate)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "a number JSON does not have (NaN or Infinity)"
        elif isinstance(item, (dict, list)):
            if depth >= MAX_NESTING:
                return f"values nested deeper than {MAX_NESTING} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None
