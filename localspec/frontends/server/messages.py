"""POST /v1/messages (Anthropic's Messages API, as Claude Code speaks it) and /v1/messages/count_tokens: the request,
its history made chat messages, the answer's shape (content blocks, events), its routes."""

from __future__ import annotations

import json
import secrets
import time
from typing import Annotated, Any, ClassVar, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from localspec.api import TokenLogprob, ToolCall, json_schema_grammar
from localspec.frontends.server.errors import ApiError
from localspec.frontends.server.schemas import (
    MAX_CACHE_KEY,
    MAX_MESSAGES,
    MAX_STOP_LENGTH,
    MAX_TOOLS,
    Common,
    check_named_tool,
)
from localspec.frontends.server.service import Service
from localspec.frontends.server.shapes import Served, TokenBytes, sse

# A system block that only carries the client's billing header (Claude Code's first block: its version and entry
# point, which change between versions and sessions): not an instruction, and at the prompt's very start it would
# make every request a miss of the prompt cache. It is left out of the prompt.
BILLING_HEADER = "x-anthropic-billing-header:"
MAX_STOP_SEQUENCES = 16
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}


class CacheControl(BaseModel):
    """A cache breakpoint: the prefix up to here should stay cached for `ttl`."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"

    @property
    def seconds(self) -> float:
        return 3600.0 if self.ttl == "1h" else 300.0


class Cached(BaseModel):
    """What may carry a cache breakpoint."""

    model_config = ConfigDict(extra="ignore")
    cache_control: CacheControl | None = None


class TextBlock(Cached):
    model_config = ConfigDict(extra="ignore")  # citations
    type: Literal["text"]
    text: str


class RefusedBlock(BaseModel):
    """A block localspec's models cannot read: refused, naming it."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["image", "document", "search_result", "container_upload"]


class ThinkingBlock(BaseModel):
    """An earlier answer's thinking, sent back in the history: accepted, not shown to the model."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["thinking", "redacted_thinking"]


class ToolUseBlock(Cached):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Cached):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | RefusedBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(b.text for b in self.content if isinstance(b, TextBlock))


Block = Annotated[
    TextBlock | RefusedBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")
]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant", "system"]  # system: instructions added mid-conversation (Claude Code's beta)
    content: str | list[Block]

    def blocks(self) -> list[Any]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else list(self.content)


class AnthropicTool(Cached):
    """A tool the client runs (`custom`); Anthropic's own server tools (web search, code execution) name a
    versioned type and have no schema: localspec cannot run them, and leaves them out."""

    model_config = ConfigDict(extra="ignore")
    type: str | None = None
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any] | None = None

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            json_schema_grammar(v, lenient=True)  # once, as OpenAI's tools are: a GrammarError names what is wrong
        return v

    def function(self) -> dict[str, Any] | None:
        """As an OpenAI function tool (None: a server tool)."""
        if self.type not in (None, "custom") or self.input_schema is None:
            return None
        fn = {"name": self.name, "description": self.description, "parameters": self.input_schema}
        return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")  # disable_parallel_tool_use
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None

    def openai(self) -> str | dict[str, Any]:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"any": "required"}.get(self.type, self.type)


class Metadata(BaseModel):
    model_config = ConfigDict(extra="ignore")
    user_id: Annotated[str | None, Field(max_length=MAX_CACHE_KEY)] = None


class MessagesRequest(Common):
    """Anthropic's Messages request. `thinking`, `context_management`, `output_config` and the betas are accepted
    and have no effect; `cache_control` breakpoints hold the conversation's cached prefix (see `cache`)."""

    PROMPT_FIELD: ClassVar[str] = "messages"
    ANY_MODEL: ClassVar[bool] = True  # Claude Code asks for its own model names: the one served answers
    CAP_TO_ROOM: ClassVar[bool] = True  # max_tokens beyond the context's room: answered up to the room
    max_tokens: Annotated[int, Field(ge=1)]
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    metadata: Metadata | None = None
    cache_control: CacheControl | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(v) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(len(s) > MAX_STOP_LENGTH for s in v or []):
            raise ValueError(f"a stop sequence may be at most {MAX_STOP_LENGTH} characters")
        return v

    def _functions(self) -> list[dict[str, Any]]:
        return [f for t in self.tools or [] if (f := t.function()) is not None]

    def check(self) -> None:
        names = [f["function"]["name"] for f in self._functions()]
        if self.tool_choice is not None and self.tool_choice.type in ("any", "tool"):
            check_named_tool(self.tool_choice.name if self.tool_choice.type == "tool" else None, names)

    def stops(self) -> list[str]:
        return list(self.stop_sequences or [])

    def options(self) -> dict[str, Any]:
        choice = self.tool_choice.openai() if self.tool_choice else "auto"
        functions = self._functions()
        return {"tools": functions if functions and choice != "none" else None, "tool_choice": choice}

    def cache(self) -> dict[str, Any]:
        """Options' cache key and hold where a cache breakpoint is set (on the request, the system, a tool or a
        message's block): the conversation's newest entry, keyed by the client's user id (Claude Code's names its
        session), is held from eviction until the key goes unused for the longest breakpoint's ttl."""
        system = self.system if isinstance(self.system, list) else []
        blocks = [b for m in self.messages for b in m.blocks()]
        marks = [self.cache_control] + [
            m.cache_control for m in [*system, *(self.tools or []), *blocks] if isinstance(m, Cached)
        ]
        ttls = [mark.seconds for mark in marks if mark is not None]
        if not ttls:
            return {}
        user = self.metadata.user_id if self.metadata is not None and self.metadata.user_id else ""
        return {"cache_key": f"anthropic:{user}", "cache_hold": max(ttls)}

    def chat(self) -> list[dict[str, Any]]:
        """The conversation as the chat template reads it: the system text first (its billing header left out, the
        conversation's system messages after it: Claude Code adds a fixed one after each session's first question,
        which kept there would part every session's prompt from the last at that question, and most chat templates
        take a system message only first), each tool_use an assistant's call, each tool_result a tool message,
        thinking left out; images and documents refused with a 400 naming the block."""
        out: list[dict[str, Any]] = []
        blocks = [TextBlock(type="text", text=self.system)] if isinstance(self.system, str) else self.system or []
        texts = [b.text for b in blocks if not b.text.startswith(BILLING_HEADER)]
        texts += [
            "".join(b.text for b in m.blocks() if isinstance(b, TextBlock)) for m in self.messages if m.role == "system"
        ]
        if system := "\n\n".join(t for t in texts if t):
            out.append({"role": "system", "content": system})
        for i, message in enumerate(self.messages):
            if message.role == "system":
                continue
            text: list[str] = []
            calls: list[dict[str, Any]] = []
            for j, block in enumerate(message.blocks()):
                if isinstance(block, RefusedBlock) or (
                    isinstance(block, ToolResultBlock)
                    and not isinstance(block.content, str)
                    and any(isinstance(b, RefusedBlock) for b in block.content)
                ):
                    kind = block.type if isinstance(block, RefusedBlock) else "tool_result with an image"
                    raise ApiError(
                        400,
                        f"messages.{i}.content.{j}: localspec's models read text only, not a {kind} block",
                        param=f"messages.{i}.content.{j}",
                    )
                if isinstance(block, TextBlock):
                    text.append(block.text)
                elif isinstance(block, ToolUseBlock):
                    arguments = json.dumps(block.input, ensure_ascii=False)
                    calls.append(ToolCall(block.name, arguments, block.id).openai())
                elif isinstance(block, ToolResultBlock):
                    if text:  # text before a result stays before it
                        out.append({"role": message.role, "content": "".join(text)})
                        text = []
                    result = block.text()
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": block.tool_use_id,
                            "content": f"Error: {result}" if block.is_error else result,
                        }
                    )
            if text or calls:
                m: dict[str, Any] = {"role": message.role, "content": "".join(text)}
                if calls:
                    m["tool_calls"] = calls
                out.append(m)
        return out


def usage(served: Served) -> dict[str, Any]:
    """Anthropic's usage: the prompt's tokens the cache held are read from it, the rest are input."""
    st = served.stats
    return {
        "input_tokens": st.prompt_tokens - st.cached_tokens,
        "output_tokens": st.completion_tokens,
        "cache_read_input_tokens": st.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


class MessagesShape:
    """Anthropic's answer: a message of content blocks (text, then tool_use), or its events as they come: the text
    block opened at the first text, each call a tool_use block with its input as one input_json_delta."""

    def __init__(self, model: str) -> None:
        self.model, self.rid, self.now = model, f"msg_{secrets.token_hex(12)}", int(time.time())
        self.text_open = False

    def headers(self) -> dict[str, str]:
        return {}

    def logprobs(self, entries: list[TokenLogprob], piece: TokenBytes) -> dict[str, Any] | None:
        return None

    def _message(self, content: list[dict[str, Any]], served: Served | None, tokens: int = 0) -> dict[str, Any]:
        return {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": STOP_REASONS.get(served.finish_reason, "end_turn") if served else None,
            "stop_sequence": None,
            "usage": usage(served) if served else {"input_tokens": tokens, "output_tokens": 0},
        } | (self._stop(served) if served else {})

    @staticmethod
    def _stop(served: Served) -> dict[str, Any]:
        matched = served.stats.stop_sequence
        return {"stop_reason": "stop_sequence", "stop_sequence": matched} if matched else {}

    @staticmethod
    def _tool_use(served: Served) -> list[dict[str, Any]]:
        return [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments or "{}")}
            for c in served.tool_calls
        ]

    def final(self, served: Served) -> dict[str, Any]:
        content = [{"type": "text", "text": served.text}] if served.text or not served.tool_calls else []
        return self._message(content + self._tool_use(served), served)

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, kind)

    def opening(self, prompt_tokens: int) -> list[bytes]:
        return [self._event("message_start", message=self._message([], None, prompt_tokens)), self._event("ping")]

    def delta(self, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        if not text:
            return []
        out = [] if self.text_open else [self._open_text()]
        self.text_open = True
        return [*out, self._event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})]

    def closing(self, served: Served) -> list[bytes]:
        out = [self._event("content_block_stop", index=0)] if self.text_open else []
        for index, block in enumerate(self._tool_use(served), start=int(self.text_open)):
            out.append(self._event("content_block_start", index=index, content_block={**block, "input": {}}))
            partial = json.dumps(block["input"], ensure_ascii=False)
            out.append(
                self._event(
                    "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial}
                )
            )
            out.append(self._event("content_block_stop", index=index))
        message = self._message([], served)
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
        out.append(self._event("message_delta", delta=delta, usage=message["usage"]))
        return [*out, self._event("message_stop")]

    def failure(self, error: ApiError) -> list[bytes]:
        return [sse(error.body(anthropic=True), "error")]

    def keepalive(self) -> list[bytes]:
        """A ping, as Anthropic's API sends, and an empty text delta (the text block opened for it): Claude Code
        gives up on a stream after 300 s without an event its SDK passes on, and the SDK drops pings."""
        out = [] if self.text_open else [self._open_text()]
        self.text_open = True
        delta = {"type": "text_delta", "text": ""}
        return [*out, self._event("ping"), self._event("content_block_delta", index=0, delta=delta)]

    def _open_text(self) -> bytes:
        return self._event("content_block_start", index=0, content_block={"type": "text", "text": ""})


class CountRequest(MessagesRequest):
    """count_tokens takes a Messages request without max_tokens."""

    max_tokens: Annotated[int, Field(ge=1)] = 1


def add_route(router: APIRouter, service: Service) -> None:
    @router.post("/messages")
    async def messages(request: Request, req: MessagesRequest) -> Any:
        return await service.serve(request, req, MessagesShape(service.model_id), req.chat(), req.max_tokens)

    @router.post("/messages/count_tokens")
    async def count_tokens(request: Request, req: CountRequest) -> Any:
        req.check()
        prepared = await service.prepare(req.chat(), None, req)
        return {"input_tokens": len(prepared.tokens)}
