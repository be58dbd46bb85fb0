"""Prompts as tokens: the target's own chat template from its GGUF, or raw completion text.

Message contents are tokenized with special=False, so text that looks like a control token
(`<|im_end|>`) stays text; only the template's own markup becomes control tokens, whatever the template
does to the text (a template that escapes it with tojson: the escaped text, still plain). A raw prompt is
the caller's whole text and is read with its control tokens.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from typing import Any

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from localspec.core.tool_calls import CLOSE, OPEN, template_supports_tools
from localspec.errors import LocalspecError, Unsupported
from localspec.llama.model import Model

# {"role": str, "content": str, optional "tokens": list[int] (content already tokenized), and OpenAI's
# "tool_calls" (arguments as JSON text), "tool_call_id" and "name"}
Message = dict


def _formatter(model: Model) -> Jinja2ChatFormatter:
    meta = model.metadata
    template = meta.get("tokenizer.chat_template")
    if not template:
        raise LocalspecError(f"{model.name} has no chat template in its GGUF; use --raw for plain completion")

    def token(key: str) -> str:
        tid = meta.get(key)
        return model.token_text(int(tid)) if tid is not None else ""

    return Jinja2ChatFormatter(
        template=template,
        eos_token=token("tokenizer.ggml.eos_token_id"),
        bos_token=token("tokenizer.ggml.bos_token_id"),
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
    fmt = _formatter(model)
    fmt.add_generation_prompt = add_generation_prompt
    if tools and not supports_tools(model):
        raise Unsupported(f"{model.name}'s chat template has no tool calls in a format localspec reads", "tools")
    plain = [_for_template(m) for m in messages]
    nonce = secrets.token_hex(8)  # letters and digits only: a marker that survives a template's escaping (tojson)
    texts: list[str] = []
    contents: dict[int, int] = {}  # the slot of each message's content

    def slotted(value: Any, wrap: bool, data: bool = False) -> Any:
        """`value` with each non-empty text in it a marker (`wrap`: the text between two markers); in `data` (a
        call's arguments, a tool's parameters) the keys too."""
        if isinstance(value, str) and value:
            i = len(texts) if not wrap else next(counter)
            if not wrap:
                texts.append(value)
            return f"lsb{nonce}n{i}e{value}lse{nonce}n{i}e" if wrap else f"lsslot{nonce}n{i}e"
        if isinstance(value, dict):
            return {
                slotted(k, wrap) if data else k: v
                if k in _STRUCTURE and not data
                else slotted(v, wrap, data or k in _DATA)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [slotted(v, wrap, data) for v in value]
        return value

    skeleton_messages = []
    for index, m in enumerate(plain):
        if isinstance(m.get("content"), str) and m["content"]:
            contents[index] = len(texts)
        skeleton_messages.append(slotted(m, wrap=False))
    skeleton_tools = [slotted(t, wrap=False) for t in tools or []]  # a tool's name, description, parameters: text
    skeleton = _render(fmt, skeleton_messages, skeleton_tools)
    parts = re.split(f"lsslot{nonce}n(\\d+)e", skeleton)
    shown = parts[1::2]
    if len(set(shown)) != len(shown):
        raise Unsupported(f"{model.name}'s chat template repeats message text", "messages")
    whole = _render(fmt, plain, tools)
    written = _aligned(parts, {i: texts[int(i)] for i in shown}, whole)  # the texts as they are, or trimmed
    if written is None:  # the template transforms text (escapes it): what it writes between two markers
        counter = iter(range(len(texts)))
        wrapped_messages = [slotted(m, wrap=True) for m in plain]
        wrapped = _render(fmt, wrapped_messages, [slotted(t, wrap=True) for t in tools or []])
        found = dict(re.findall(f"lsb{nonce}n(\\d+)e(.*?)lse{nonce}n\\1e", wrapped, flags=re.DOTALL))
        written = _aligned(parts, found, whole)
    if written is None:
        raise Unsupported(
            "the chat template writes the rest of the conversation differently with this conversation's text: "
            "localspec cannot keep that text apart from the template's own markup",
            "messages",
        )
    verbatim = {i for i in written if written[i] == texts[i]}
    own = {slot: index for index, slot in contents.items() if slot in verbatim and "tokens" in messages[index]}
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            tokens += model.tokenize(part, special=True) if part else []
        elif int(part) in own:
            tokens += messages[own[int(part)]]["tokens"]
        else:  # the text as the template writes it (escaped, say): plain text, never control tokens
            tokens += model.tokenize(written[int(part)], special=False)
    return tokens


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
