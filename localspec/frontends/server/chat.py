"""POST /v1/chat/completions: its request, its answer's shape (chunks with deltas, tool calls), its route."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from localspec.api import TokenLogprob, ToolCall
from localspec.frontends.server.schemas import (
    MAX_MESSAGES,
    MAX_TOOLS,
    ChatMessage,
    RequestBase,
    Tool,
    ToolChoiceFunction,
    check_named_tool,
)
from localspec.frontends.server.service import Service
from localspec.frontends.server.shapes import Chunks, Served, TokenBytes, token_text


class ChatRequest(RequestBase):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int | None, Field(ge=1)] = None
    logprobs: bool | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None

    def check(self) -> None:
        """What no single field shows: a named tool that is not among the tools."""
        self.refuse_unsupported()
        names = [t.function.name for t in self.tools or []]
        if isinstance(self.tool_choice, ToolChoiceFunction):
            check_named_tool(self.tool_choice.function.name, names)
        elif self.tool_choice == "required":
            check_named_tool(None, names)

    def options(self) -> dict[str, Any]:
        """Options' fields for what this request asks beyond sampling."""
        choice = self.tool_choice or "auto"
        return {
            "response_format": self.response_format.openai() if self.response_format else None,
            "tools": [t.model_dump(exclude_none=True) for t in self.tools] if self.tools and choice != "none" else None,
            "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
            "logprobs": (self.top_logprobs or 0) if self.logprobs else None,
        }


def chat_logprobs(entries: list[TokenLogprob], piece: TokenBytes) -> dict[str, Any]:
    """Chat completions' logprobs: each token with its bytes and its most likely alternatives."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        text, raw = token_text(piece, token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content = [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def call_deltas(calls: list[ToolCall]) -> list[list[dict[str, Any]]]:
    """Streamed tool calls as OpenAI sends them: per call, its id and name, then its arguments."""
    out = []
    for i, c in enumerate(calls):
        out.append([{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}])
        out.append([{"index": i, "function": {"arguments": c.arguments}}])
    return out


class ChatShape(Chunks):
    """Chat completions' answer: a message, or chunks whose deltas carry the role, the text and the tool calls."""

    ID: ClassVar[str] = "chatcmpl"
    OBJECT: ClassVar[str] = "chat.completion"
    CHUNK: ClassVar[str] = "chat.completion.chunk"

    def logprobs(self, entries: list[TokenLogprob], piece: TokenBytes) -> dict[str, Any] | None:
        return chat_logprobs(entries, piece)

    def choice(self, text: str | None, logprobs: dict[str, Any] | None, **delta: Any) -> dict[str, Any]:
        if text is not None:
            delta["content"] = text
        return {"delta": delta, "logprobs": logprobs}

    def opening(self, prompt_tokens: int) -> list[bytes]:
        return [self.chunk(self.choice(None, None, role="assistant", content=""))]

    def closing(self, served: Served) -> list[bytes]:
        calls = [self.chunk(self.choice(None, None, tool_calls=d)) for d in call_deltas(served.tool_calls)]
        return [*calls, *super().closing(served)]

    def whole(self, served: Served) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": served.text}
        if served.tool_calls:
            message = {"role": "assistant", "content": served.text or None}
            message["tool_calls"] = [c.openai() for c in served.tool_calls]
        return {"message": message}


def add_route(router: APIRouter, service: Service) -> None:
    @router.post("/chat/completions")
    async def chat_completions(request: Request, req: ChatRequest) -> Any:
        messages = [m.for_template() for m in req.messages]
        shape = ChatShape(service.model_id, req.include_usage())
        return await service.serve(request, req, shape, messages, req.max_completion_tokens or req.max_tokens)
