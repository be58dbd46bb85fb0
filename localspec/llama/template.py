"""Prompts as tokens: the target's own chat template from its GGUF, or raw completion text.

Message contents are tokenized with special=False, so text that looks like a control token
(`<|im_end|>`) stays text; only the template's own markup becomes control tokens, whatever the template
does to the text (a template that escapes it with tojson: the escaped text, still plain). A raw prompt is
the caller's whole text and is read with its control tokens.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import secrets
from collections.abc import Callable
from typing import Any

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from localspec.core.tool_calls import CLOSE, OPEN, template_supports_tools
from localspec.errors import LocalspecError, Unsupported
from localspec.llama.model import Model

# {"role": str, "content": str, optional "tokens": list[int] (content already tokenized), and OpenAI's
# "tool_calls" (arguments as JSON text), "tool_call_id" and "name"}
Message = dict


def _formatter(model: Model, add_generation_prompt: bool = True) -> Jinja2ChatFormatter:
    """The model's chat template, compiled once (a compilation takes about 30 ms: every request would pay it)."""
    meta = model.metadata
    template = meta.get("tokenizer.chat_template")
    if not template:
        raise LocalspecError(f"{model.name} has no chat template in its GGUF; use --raw for plain completion")

    def token(key: str) -> str:
        tid = meta.get(key)
        return model.token_text(int(tid)) if tid is not None else ""

    eos, bos = token("tokenizer.ggml.eos_token_id"), token("tokenizer.ggml.bos_token_id")
    return _compiled(template, eos, bos, add_generation_prompt)


@functools.lru_cache(maxsize=16)
def _compiled(template: str, eos: str, bos: str, add_generation_prompt: bool) -> Jinja2ChatFormatter:
    """A formatter never changed once made: one may render on several threads at once."""
    return Jinja2ChatFormatter(
        template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
    )


def chat_tokens(
    model: Model, messages: list[Message], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
) -> list[int]:
    """The conversation rendered by the model's chat template (with `tools` described), as tokens.

    Every text a message carries (its content, a tool call's name, id and arguments, a tool result's id and
    name), and every text of a tool's (its name, description, and its parameters' names, descriptions and enums),
    is read as text, never as control tokens: the template renders the conversation once with a marker
    in place of each, its own markup between the markers is tokenized with control tokens, each text without.
    A message carrying "tokens" contributes those instead of re-tokenizing its content, so a generated reply
    is fed back exactly as it was sampled and the KV cache prefix still matches.
    """
    fmt = _formatter(model, add_generation_prompt)
    if tools and not supports_tools(model):
        raise Unsupported(f"{model.name}'s chat template has no tool calls in a format localspec reads", "tools")
    plain = [_for_template(m) for m in messages]
    slots, contents, skeleton_messages = _Slots(), {}, []  # contents: the slot of each message's content
    for index, m in enumerate(plain):
        if isinstance(m.get("content"), str) and m["content"]:
            contents[index] = len(slots.texts)
        skeleton_messages.append(slots.marked(m))
    skeleton = _render(fmt, skeleton_messages, [slots.marked(t) for t in tools or []])  # tools' texts too
    parts = re.split(f"lsslot{slots.nonce}n(\\d+)e", skeleton)
    shown = parts[1::2]
    if len(set(shown)) != len(shown):
        raise Unsupported(f"{model.name}'s chat template repeats message text", "messages")
    written = _written(fmt, slots, parts, plain, tools)
    own = {
        slot: messages[index]["tokens"]
        for index, slot in contents.items()
        if written.get(slot) == slots.texts[slot] and "tokens" in messages[index]
    }
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            tokens += model.tokenize(part, special=True) if part else []
        elif int(part) in own:
            tokens += own[int(part)]
        else:  # the text as the template writes it (escaped, say): plain text, never control tokens
            tokens += model.tokenize(written[int(part)], special=False)
    return tokens


class _Slots:
    """The texts of a conversation, each replaced by a marker (`marked`), or wrapped between two (`wrapped`, in
    the same order): letters and digits only, so a marker survives a template's escaping (tojson)."""

    def __init__(self) -> None:
        self.nonce = secrets.token_hex(8)
        self.texts: list[str] = []
        self._wrapped = 0

    def marked(self, value: Any, data: bool = False) -> Any:
        """`value` with each non-empty text in it a marker, its text kept in `texts`; in `data` (a call's
        arguments, a tool's parameters) the keys too."""
        if isinstance(value, str) and value:
            self.texts.append(value)
            return f"lsslot{self.nonce}n{len(self.texts) - 1}e"
        return self._each(value, data, self.marked)

    def wrapped(self, value: Any, data: bool = False) -> Any:
        """`value` with each non-empty text between two markers of its slot."""
        if isinstance(value, str) and value:
            i, self._wrapped = self._wrapped, self._wrapped + 1
            return f"lsb{self.nonce}n{i}e{value}lse{self.nonce}n{i}e"
        return self._each(value, data, self.wrapped)

    @staticmethod
    def _each(value: Any, data: bool, slot: Callable[[Any, bool], Any]) -> Any:
        if isinstance(value, dict):
            return {
                slot(k, False) if data else k: v if k in _STRUCTURE and not data else slot(v, data or k in _DATA)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [slot(v, data) for v in value]
        return value


def _written(
    fmt: Jinja2ChatFormatter, slots: _Slots, parts: list[str], plain: list[dict], tools: list[dict] | None
) -> dict[int, str]:
    """Each slot's text as the template writes it in the whole rendering: the text itself (or trimmed), else what
    the template writes between its two markers (a template that escapes text)."""
    whole = _render(fmt, plain, tools)
    written = _aligned(parts, {i: slots.texts[int(i)] for i in parts[1::2]}, whole)
    if written is None:
        wrapped = _render(fmt, [slots.wrapped(m) for m in plain], [slots.wrapped(t) for t in tools or []])
        nonce = slots.nonce
        found = dict(re.findall(f"lsb{nonce}n(\\d+)e(.*?)lse{nonce}n\\1e", wrapped, flags=re.DOTALL))
        written = _aligned(parts, found, whole)
    if written is None:
        raise Unsupported(
            "the chat template writes the rest of the conversation differently with this conversation's text: "
            "localspec cannot keep that text apart from the template's own markup",
            "messages",
        )
    return written


_STRUCTURE = ("role", "type", "tokens")  # fields templates branch on: never slotted
_DATA = ("arguments", "parameters")  # fields written as data (with tojson): their keys are text too


def _aligned(parts: list[str], found: dict[str, str], whole: str) -> dict[int, str] | None:
    """Each slot's text as the template wrote it in `whole`: what it wrote between the slot's markers (`found`:
    escaped, say), trimmed where the template trims it; None where the template's markup and those texts do
    not make up `whole` (the template writes its markup differently with the real texts)."""
    written: dict[int, str] = {}
    at = 0
    for i, part in enumerate(parts):
        if i % 2 == 0:
            if not whole.startswith(part, at):
                return None
            at += len(part)
            continue
        text, after = found.get(part, ""), parts[i + 1]
        fits = [t for t in (text, text.strip(), text.lstrip(), text.rstrip()) if whole.startswith(t + after, at)]
        if not fits:
            return None
        written[int(part)] = fits[0]
        at += len(fits[0])
    return written if at == len(whole) else None


def _for_template(m: Message) -> Message:
    """A message as templates read it: tool calls' arguments as objects (they write them with tojson)."""
    out = {k: v for k, v in m.items() if k != "tokens"}
    if m.get("tool_calls"):
        calls = []
        for call in m["tool_calls"]:
            fn = dict(call.get("function", {}))
            with contextlib.suppress(TypeError, ValueError):
                fn["arguments"] = json.loads(fn.get("arguments") or "{}")
            calls.append({**call, "function": fn})
        out["tool_calls"] = calls
    return out


def supports_tools(model: Model) -> bool:
    """The template describes tools and its calls are <tool_call> blocks (Qwen2.5, Hermes and others)."""
    return template_supports_tools(model.metadata.get("tokenizer.chat_template") or "")


def tool_tags(model: Model) -> tuple[str, str]:
    """The call tags as grammar terms: a special token by id where the vocabulary has one, else the text."""

    def term(tag: str) -> str:
        ids = model.tokenize(tag, special=True)
        return f"<[{ids[0]}]>" if len(ids) == 1 else json.dumps(tag)

    return term(OPEN), term(CLOSE)


def _render(fmt: Jinja2ChatFormatter, messages: list[Message], tools: list[dict] | None = None) -> str:
    """The template's text; a template that refuses the messages (roles that do not alternate) is a LocalspecError."""
    try:
        return fmt(messages=messages, tools=tools or None).prompt  # type: ignore[arg-type]
    except (jinja2.TemplateError, ValueError) as e:
        raise LocalspecError(f"the model's chat template refused these messages: {e}") from None


def fim_tokens(model: Model, prefix: str, suffix: str) -> list[int]:
    """Fill-in-the-middle: the prefix and suffix around the model's own FIM tokens, as it was trained."""
    pre, suf, mid = model.fim_tokens()
    if min(pre, suf, mid) < 0:
        raise Unsupported(f"{model.name} has no fill-in-the-middle tokens; it cannot complete with a suffix", "suffix")
    return [pre, *model.tokenize(prefix), suf, *model.tokenize(suffix), mid]


def raw_tokens(model: Model, text: str) -> list[int]:
    """Plain completion: the text as-is, with BOS where the model wants one (as create_completion does).

    The prompt is the caller's own whole text, so control-token text in it is those tokens (an editor
    that writes its own <|fim_prefix|> … <|fim_middle|> prompt gets FIM), as llama-server reads it."""
    return model.tokenize(text, add_bos=True, special=True)
