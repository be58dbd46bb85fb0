"""OpenAI's Responses API (`POST /v1/responses`, what Codex CLI speaks): its request read as a chat, its answer
as output items, whole or as the named events of its stream; stored responses (`GET`, `DELETE`).

A response is stored unless its request says `store: false` (stored.py), and `previous_response_id` continues its
conversation without the client sending it again (the new request's instructions replace the earlier ones, as
OpenAI's do). Codex sends `store: false` and resends the history each turn, which the target's cached prefix makes
cheap. Tools the server cannot run (web search, image generation,
hosted shells) are left out of the prompt and named in the `X-Localspec-Skipped-Tools` header and the response's
`localspec.skipped_tools`; a namespace's functions (an MCP server's) are offered as `namespace.function` and mapped
back in the calls.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from localspec.api import ANY_JSON_OBJECT, TokenLogprob, ToolCall, json_schema_grammar
from localspec.frontends.server.errors import ApiError
from localspec.frontends.server.schemas import (
    MAX_MESSAGES,
    MAX_TOOLS,
    ChatMessage,
    Common,
    FunctionCall,
    FunctionDef,
    ToolCallMessage,
    check_named_tool,
)
from localspec.frontends.server.service import Service
from localspec.frontends.server.shapes import COMMENT, Served, TokenBytes, figures, sse
from localspec.frontends.server.stored import ResponseStore
from localspec.paths import cache_dir

TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
MEDIA_PARTS = frozenset({"input_image", "input_file", "input_audio"})
# items a client may send back that carry nothing the model can read here (encrypted reasoning, hosted calls)
IGNORED_ITEMS = frozenset(
    {
        "reasoning",
        "compaction",
        "compaction_summary",
        "web_search_call",
        "image_generation_call",
        "file_search_call",
        "code_interpreter_call",
        "tool_search_call",
        "tool_search_output",
        "local_shell_call",
        "local_shell_call_output",
        "mcp_list_tools",
        "mcp_call",
        "mcp_approval_request",
        "mcp_approval_response",
    }
)


class ContentPart(BaseModel):
    """A part of a message: text (input, output, summary) or a refusal; media cannot be read here."""

    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _readable(self) -> ContentPart:
        if self.type in MEDIA_PARTS:
            raise ValueError(f"localspec's models read text only: a '{self.type}' part cannot be read")
        if self.type == "refusal" and isinstance(self.refusal, str):
            return self
        if self.type not in TEXT_PARTS or self.text is None:
            raise ValueError(f"a content part of type '{self.type}' with no text cannot be read")
        return self

    def value(self) -> str:
        return self.refusal if self.type == "refusal" and self.refusal is not None else self.text or ""


Content = str | list[ContentPart]


def _text(content: Content) -> str:
    return content if isinstance(content, str) else "".join(p.value() for p in content)


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call", "custom_tool_call"]
    call_id: str
    name: str
    namespace: str | None = None
    arguments: str | None = None
    input: str | None = None  # a custom tool's freeform input

    def args(self) -> str:
        return self.arguments if self.arguments is not None else json.dumps({"input": self.input or ""})


class CallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: Content


class IgnoredItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


class UnknownItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> UnknownItem:
        why = " (it refers to a stored item; send the item itself)" if self.type == "item_reference" else ""
        raise ValueError(f"localspec cannot read input items of type '{self.type}'{why}")


def _item_kind(v: Any) -> str:
    kind = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", "message")
    if not isinstance(kind, str):
        return "unknown"
    if kind in ("message", "function_call", "custom_tool_call"):
        return "call" if kind != "message" else "message"
    if kind in ("function_call_output", "custom_tool_call_output"):
        return "output"
    return "ignored" if kind in IGNORED_ITEMS else "unknown"


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("call")]
    | Annotated[CallOutputItem, Tag("output")]
    | Annotated[IgnoredItem, Tag("ignored")]
    | Annotated[UnknownItem, Tag("unknown")],
    Discriminator(_item_kind),
]


class FunctionTool(FunctionDef):
    type: Literal["function"]


class NamespaceTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["namespace"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)]


class SkippedTool(BaseModel):
    """A tool the server cannot run (web search, image generation, hosted shells, custom grammars)."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_kind(v: Any) -> str:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return kind if kind in ("function", "namespace") else "skipped"


ToolParam = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[SkippedTool, Tag("skipped")],
    Discriminator(_tool_kind),
]


class FunctionChoice(BaseModel):
    type: Literal["function"]
    name: str
    namespace: str | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema(self) -> TextFormat:
        if self.type == "json_schema":
            json_schema_grammar(self.schema_ or ANY_JSON_OBJECT)  # a GrammarError (a ValueError) names what is wrong
        return self

    def response_format(self) -> dict[str, Any] | None:
        """As LocalSpec.generate takes it (chat completions' response_format)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        schema = {"name": self.name, "schema": self.schema_ or ANY_JSON_OBJECT, "strict": self.strict}
        return {"type": "json_schema", "json_schema": schema}


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None


class ResponsesRequest(Common):
    """A Responses API request. Accepted and not acted on: `reasoning`, `include`, `client_metadata`, `metadata`,
    `truncation`, `user`, `service_tier`."""

    PROMPT_FIELD: ClassVar[str] = "input"
    LENGTH_FIELD: ClassVar[str] = "max_output_tokens"

    input: str | Annotated[list[Item], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: str | None = None
    tools: Annotated[list[ToolParam], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: Annotated[int | None, Field(ge=1)] = None
    text: TextOptions | None = None
    previous_response_id: str | None = None
    store: bool = True
    conversation: str | dict[str, Any] | None = None
    background: bool = False
    metadata: dict[str, Any] | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _few_functions(cls, v: Any) -> Any:
        """At most MAX_TOOLS functions in all, a namespace's each counted, before any of their schemas compiles."""
        if isinstance(v, list):
            members = (t.get("tools") if isinstance(t, dict) and t.get("type") == "namespace" else None for t in v)
            if sum(len(m) if isinstance(m, list) else 1 for m in members) > MAX_TOOLS:
                raise ValueError(f"at most {MAX_TOOLS} functions in all (each of a namespace's counts)")
        return v

    @field_validator("conversation")
    @classmethod
    def _no_conversations(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError(
                "localspec keeps no conversation objects: continue a stored response with previous_response_id, or "
                "send the whole conversation in input"
            )
        return v

    @field_validator("background")
    @classmethod
    def _foreground(cls, v: bool) -> bool:
        if v:
            raise ValueError("localspec answers in the foreground only (stream for early text)")
        return v

    @cached_property
    def functions(self) -> dict[str, tuple[str | None, FunctionDef]]:
        """The functions offered, by the name the model sees: a namespace's as `namespace.function` (made once)."""
        out: dict[str, tuple[str | None, FunctionDef]] = {}
        for tool in self.tools or []:
            members: list[tuple[str | None, FunctionDef]] = [(None, tool)] if isinstance(tool, FunctionTool) else []
            if isinstance(tool, NamespaceTool):
                members = [(tool.name, t) for t in tool.tools]
            for namespace, fn in members:
                name = flat(namespace, fn.name)
                if name in out:
                    raise ApiError(400, f"two tools are named '{name}'", param="tools")
                out[name] = (namespace, fn)
        return out

    def skipped(self) -> list[str]:
        """The tools left out: types the server cannot run."""
        return [t.type for t in self.tools or [] if isinstance(t, SkippedTool)]

    def check(self) -> None:
        functions = self.functions
        if isinstance(self.tool_choice, FunctionChoice):
            check_named_tool(flat(self.tool_choice.namespace, self.tool_choice.name), list(functions))
        elif self.tool_choice == "required":
            check_named_tool(None, list(functions))

    def options(self) -> dict[str, Any]:
        choice = self.tool_choice or "auto"
        tools = [
            {"type": "function", "function": fn.model_dump(exclude_none=True) | {"name": name}}
            for name, (_, fn) in self.functions.items()
        ]
        if isinstance(choice, FunctionChoice):
            named: str | dict[str, Any] = {
                "type": "function",
                "function": {"name": flat(choice.namespace, choice.name)},
            }
        else:
            named = choice
        fmt = self.text.format if self.text else None
        return {
            "response_format": fmt.response_format() if fmt else None,
            "tools": tools if tools and choice != "none" else None,
            "tool_choice": named,
            "logprobs": None,
        }

    def messages(self, history: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The conversation as the chat template reads it: the instructions and leading system or developer
        messages as one system message, then `history` (a stored response's conversation), then the input: calls
        as the assistant's tool calls, their outputs as tool messages."""
        items: list[Any] = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        system = [self.instructions] if self.instructions else []
        while items and isinstance(items[0], MessageItem) and items[0].role in ("system", "developer"):
            system.append(_text(items[0].content))
            items = items[1:]
        head = [ChatMessage(role="system", content="\n\n".join(system)).for_template()] if system else []
        chat: list[ChatMessage] = []
        names: dict[str, str] = {}  # call id: the function's name, for its output
        for item in items:
            if isinstance(item, MessageItem):
                chat.append(ChatMessage(role=item.role, content=_text(item.content)))
            elif isinstance(item, FunctionCallItem):
                names[item.call_id] = name = flat(item.namespace, item.name)
                call = ToolCallMessage(id=item.call_id, function=FunctionCall(name=name, arguments=item.args()))
                last = chat[-1] if chat else None
                if last is None or last.role != "assistant":
                    last = ChatMessage(role="assistant", content="")
                    chat.append(last)
                last.tool_calls = [*(last.tool_calls or []), call]
            elif isinstance(item, CallOutputItem):
                chat.append(
                    ChatMessage(
                        role="tool", content=_text(item.output), tool_call_id=item.call_id, name=names.get(item.call_id)
                    )
                )
        if not chat and not history and not head:
            raise ApiError(400, "the input holds no message", param="input")
        return [*head, *(history or []), *(m.for_template() for m in chat)]


def flat(namespace: str | None, name: str) -> str:
    """The name the model sees for a function: a namespace's functions as `namespace.function`."""
    return f"{namespace}.{name}" if namespace else name


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(served: Served) -> dict[str, Any]:
    st = served.stats
    return {
        "input_tokens": st.prompt_tokens,
        "input_tokens_details": {"cached_tokens": st.cached_tokens},
        "output_tokens": st.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": st.prompt_tokens + st.completion_tokens,
        "localspec": figures(served),
    }


@dataclass
class ResponsesShape:
    """One response's output items and stream events. Text is a `message` item, opened at the first text that
    is not blank; each tool call a `function_call` item after it."""

    model: str
    request: ResponsesRequest
    keep: Callable[[dict[str, Any], dict[str, Any]], None] | None = None  # stores a finished response and its answer
    sequence: int = 0
    text: list[str] = field(default_factory=list)  # the message's text streamed so far
    blank: str = ""  # whitespace held until text follows it
    message_id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(12)}")
    rid: str = field(default_factory=lambda: f"resp_{secrets.token_hex(12)}")
    now: int = field(default_factory=lambda: int(time.time()))

    def headers(self) -> dict[str, str]:
        skipped = self.request.skipped()
        return {"X-Localspec-Skipped-Tools": ",".join(skipped)} if skipped else {}

    def logprobs(self, entries: list[TokenLogprob], piece: TokenBytes) -> dict[str, Any] | None:
        return None

    @property
    def _where(self) -> dict[str, Any]:
        """Where the message's text part is: its item, first in the output, its only part."""
        return {"item_id": self.message_id, "output_index": 0, "content_index": 0}

    def _event(self, kind: str, **body: Any) -> bytes:
        self.sequence += 1
        return sse({"type": kind, "sequence_number": self.sequence - 1, **body}, event=kind)

    def _response(self, status: str, output: list[dict[str, Any]], served: Served | None = None) -> dict[str, Any]:
        req = self.request
        length = served is not None and served.finish_reason == "length"
        fmt = req.text.format if req.text and req.text.format else None
        return {
            "id": self.rid,
            "object": "response",
            "created_at": self.now,
            "status": "incomplete" if length and status == "completed" else status,
            "model": self.model,
            "output": output,
            "usage": _usage(served) if served else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": req.store,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": req.tool_choice.model_dump()
            if isinstance(req.tool_choice, FunctionChoice)
            else (req.tool_choice or "auto"),
            "tools": [
                t.model_dump(by_alias=True, exclude_none=True)
                for t in req.tools or []
                if not isinstance(t, SkippedTool)
            ],
            "truncation": "disabled",
            "metadata": req.metadata or {},
            "localspec": {"skipped_tools": req.skipped()},
        }

    def _message(self, text: str, status: str = "completed") -> dict[str, Any]:
        content = [_text_part(text)] if status != "in_progress" else []
        return {"id": self.message_id, "type": "message", "status": status, "role": "assistant", "content": content}

    def _calls(self, calls: list[ToolCall]) -> list[dict[str, Any]]:
        functions = self.request.functions
        calls = calls[:1] if not self.request.parallel_tool_calls else calls
        items = []
        for c in calls:
            namespace, fn = functions.get(c.name, (None, None))
            item = {
                "id": f"fc_{c.id.removeprefix('call_')}",
                "type": "function_call",
                "status": "completed",
                "call_id": c.id,
                "name": fn.name if fn else c.name,
                "arguments": c.arguments,
            }
            items.append(item | ({"namespace": namespace} if namespace else {}))
        return items

    def _output(self, text: str, served: Served) -> list[dict[str, Any]]:
        return ([self._message(text)] if text.strip() else []) + self._calls(served.tool_calls)

    def _kept(self, response: dict[str, Any], served: Served) -> dict[str, Any]:
        """A finished response, stored (where asked) with its answer as the chat template reads it."""
        if self.keep is not None:
            answer: dict[str, Any] = {"role": "assistant", "content": served.text}
            if served.tool_calls:
                calls = served.tool_calls[:1] if not self.request.parallel_tool_calls else served.tool_calls
                answer["tool_calls"] = [c.openai() for c in calls]
            self.keep(response, answer)
        return response

    def final(self, served: Served) -> dict[str, Any]:
        return self._kept(self._response("completed", self._output(served.text, served), served), served)

    def opening(self, prompt_tokens: int) -> list[bytes]:
        response = self._response("in_progress", [])
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def delta(self, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        """Text as it comes; blank text is held until text follows it (an answer that is only a call has no
        message)."""
        self.blank += text
        if not self.blank.strip():
            return []
        out = []
        if not self.text:
            out.append(self._event("response.output_item.added", output_index=0, item=self._message("", "in_progress")))
            out.append(self._event("response.content_part.added", **self._where, part=_text_part("")))
        text, self.blank = self.blank, ""
        self.text.append(text)
        return [*out, self._delta(text)]

    def _delta(self, text: str) -> bytes:
        return self._event("response.output_text.delta", **self._where, delta=text, logprobs=[])

    def closing(self, served: Served) -> list[bytes]:
        out = []
        if self.text and self.blank:  # trailing blank text of a message
            self.text.append(self.blank)
            out.append(self._delta(self.blank))
        text = "".join(self.text)
        if text:
            message = self._message(text)
            out.append(self._event("response.output_text.done", **self._where, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", **self._where, part=message["content"][0]))
            out.append(self._event("response.output_item.done", output_index=0, item=message))
        output = self._output(text, served)
        for index, item in enumerate(output[1 if text else 0 :], start=1 if text else 0):
            opened = item | {"status": "in_progress", "arguments": ""}
            out.append(self._event("response.output_item.added", output_index=index, item=opened))
            at = {"item_id": item["id"], "output_index": index}
            out.append(self._event("response.function_call_arguments.delta", **at, delta=item["arguments"]))
            out.append(
                self._event(
                    "response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"]
                )
            )
            out.append(self._event("response.output_item.done", output_index=index, item=item))
        response = self._kept(self._response("completed", output, served), served)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=response)]

    def keepalive(self) -> list[bytes]:
        return [COMMENT]  # the Responses API has no event for it

    def failure(self, error: ApiError) -> list[bytes]:
        response = self._response("failed", [])
        response["error"] = {"code": "server_error", "message": error.message}
        return [self._event("response.failed", response=response)]


def responses_dir() -> Path:
    """Where stored responses are kept."""
    return cache_dir() / "responses"


def _not_found(rid: str, param: str | None = None) -> ApiError:
    return ApiError(
        404,
        f"no response '{rid}' is stored here (made with store: false, deleted, or among the oldest removed)",
        param=param,
        code="not_found",
    )


def add_route(router: APIRouter, service: Service) -> None:
    store = ResponseStore(responses_dir())
    router.add_event_handler("shutdown", store.flush)  # a server stopping keeps what it answered

    async def stored(rid: str, param: str | None = None) -> dict[str, Any]:
        kept = await anyio.to_thread.run_sync(store.get, rid)  # a file read: off the event loop
        if kept is None:
            raise _not_found(rid, param)
        return kept

    @router.post("/responses")
    async def responses(request: Request, req: ResponsesRequest) -> Any:
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            history = (await stored(req.previous_response_id, "previous_response_id"))["history"]
        messages = req.messages(history)
        asked = messages[1:] if messages and messages[0]["role"] == "system" else messages  # instructions: per request

        def keep(response: dict[str, Any], answer: dict[str, Any]) -> None:
            store.put(response["id"], response, [*asked, answer])

        shape = ResponsesShape(service.model_id, req, keep if req.store else None)
        return await service.serve(request, req, shape, messages, req.max_output_tokens)

    @router.get("/responses/{rid}")
    async def get_response(rid: str) -> Any:
        return (await stored(rid))["response"]

    @router.delete("/responses/{rid}")
    async def delete_response(rid: str) -> Any:
        if not await anyio.to_thread.run_sync(store.delete, rid):
            raise _not_found(rid)
        return {"id": rid, "object": "response", "deleted": True}
