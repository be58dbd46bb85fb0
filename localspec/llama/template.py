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

    A message carrying "tokens" contributes those instead of re-tokenizing its content, so a
    generated reply is fed back exactly as it was sampled and the KV cache prefix still matches.
    """
    fmt = _formatter(model)
    fmt.add_generation_prompt = add_generation_prompt
    if tools and not supports_tools(model):
        raise Unsupported(f"{model.name}'s chat template has no tool calls in a format localspec reads", "tools")
    plain = [_for_template(m) for m in messages]
    texts = [m["content"] if isinstance(m.get("content"), str) else "" for m in messages]
    nonce = secrets.token_hex(8)  # letters and digits only: a marker that survives a template's escaping (tojson)
    slotted = [{**m, "content": f"lsslot{nonce}n{i}e"} if texts[i] else m for i, m in enumerate(plain)]
    skeleton = _render(fmt, slotted, tools)
    parts = re.split(f"lsslot{nonce}n(\\d+)e", skeleton)
    shown = parts[1::2]
    if len(set(shown)) != len(shown):
        raise Unsupported(f"{model.name}'s chat template repeats message text", "messages")
    verbatim = "".join(texts[int(p)] if i % 2 else p for i, p in enumerate(parts)) == _render(fmt, plain, tools)
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            tokens += model.tokenize(part, special=True) if part else []
            continue
        m = messages[int(part)]
        if verbatim and "tokens" in m:
            tokens += m["tokens"]
        else:  # the text as the template writes it (escaped, say): plain text, never control tokens
            text = texts[int(part)] if verbatim else _written(fmt, slotted, plain, int(part), skeleton, nonce, tools)
            tokens += model.tokenize(text, special=False)
    return tokens


def _written(
    fmt: Jinja2ChatFormatter,
    slotted: list[Message],
    plain: list[Message],
    index: int,
    skeleton: str,
    nonce: str,
    tools: list[dict] | None,
) -> str:
    """What a template that transforms message text writes for message `index`'s: rendered with only that text
    in place, the rest is the skeleton's, and the text is what lies between (refused where the rest changed)."""
    one = _render(fmt, [plain[index] if i == index else m for i, m in enumerate(slotted)], tools)
    marker = f"lsslot{nonce}n{index}e"
    before, after = skeleton.split(marker)
    if not (one.startswith(before) and one.endswith(after) and len(one) >= len(before) + len(after)):
        raise Unsupported(
            "the chat template writes the rest of the conversation differently with this message's text: "
            "localspec cannot keep that text apart from the template's own markup",
            "messages",
        )
    return one[len(before) : len(one) - len(after)]


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
