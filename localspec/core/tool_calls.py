"""Tool calls in the Hermes format that Qwen2.5's template (and many others) teach the model:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Parsed from the output into OpenAI's `tool_calls`, held back from a stream until complete, and,
where a call is required, enforced by a grammar whose arguments follow the function's schema. Small
models often answer with the call's JSON alone (bare or in a ```json fence) instead: an answer that is
exactly such a call of a declared tool is read as one.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localspec.core.grammar import JSON_LAYOUT, check_grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FENCED = re.compile(r"```(?:json)?\s*(\{.*\})\s*```", re.S)
_JSON_FENCE = "```json"


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as JSON text (OpenAI's shape)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{secrets.token_hex(12)}")

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call(block: str) -> ToolCall | None:
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def parse_tool_calls(text: str, names: Sequence[str] = ()) -> tuple[str, list[ToolCall]]:
    """(content, calls): the text around the calls, and the calls; text with a call that does not parse, or
    calls a tool not among `names` (where given), stays content, whole. Without tags, an answer that is only a
    call of one of `names` is that call."""
    if OPEN not in text:
        body = text.strip()
        fenced = _FENCED.fullmatch(body)
        call = _call(fenced.group(1) if fenced else body) if body.startswith(("{", "```")) else None
        return ("", [call]) if call is not None and call.name in names else (text, [])
    head, *chunks = text.split(OPEN)
    calls, content = [], [head]
    for chunk in chunks:
        body, _, tail = chunk.partition(CLOSE)
        call = _call(body)
        if call is None or (names and call.name not in names):  # not a call of a declared tool: text
            return text, []
        calls.append(call)
        content.append(tail)
    return ("".join(content).strip() if calls else text), calls


def template_supports_tools(template: str) -> bool:
    """A chat template that describes tools and has the model answer in <tool_call> blocks."""
    return "tools" in template and OPEN in template


class ToolCallStream:
    """Splits a streamed answer: content is passed on as it comes, anything from a call's opening tag
    on is held (a possible start of the tag is held until it is told apart)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.text = ""
        self._sent = 0
        self._held = False

    def feed(self, piece: str) -> str:
        """The content that can go out now."""
        self.text += piece
        head = self.text.lstrip()
        if self._held or (self._sent == 0 and (head.startswith(("{", _JSON_FENCE)) or _JSON_FENCE.startswith(head))):
            return ""  # a call, or the start of an answer that may be one call's JSON
        at = self.text.find(OPEN, self._sent)
        if at >= 0:
            self._held = True
            out, self._sent = self.text[self._sent : at], at
            return out
        safe = len(self.text)
        for n in range(min(len(OPEN) - 1, len(self.text)), 0, -1):  # a tail that may begin the tag
            if OPEN.startswith(self.text[-n:]):
                safe -= n
                break
        out, self._sent = self.text[self._sent : safe], safe
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not sent yet, calls) once the answer is complete."""
        _, calls = parse_tool_calls(self.text, self.names)
        if calls:
            return "", calls
        out, self._sent = self.text[self._sent :], len(self.text)
        return out, []


def call_grammar(tools: list[dict[str, Any]], name: str | None, open_tag: str, close_tag: str) -> str:
    """A grammar for one call (of the function `name`, or of any of `tools`) with arguments valid against
    its function's parameter schema. One: small models given room repeat a call until max_tokens. The
    tags are Lark terms: the literal text, or a special token by id (`<[151657]>`)."""
    schemas = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in (t["function"] for t in tools)
        if name is None or f["name"] == name
    ]
    schema = {"anyOf": schemas, "x-guidance": {**JSON_LAYOUT, "lenient": True}}  # as the tools were checked
    lark = f'start: {open_tag} "\\n" body "\\n" {close_tag}\nbody: %json {json.dumps(schema)}\n'
    from llguidance import LLMatcher

    return check_grammar(LLMatcher.grammar_from_lark(lark))
