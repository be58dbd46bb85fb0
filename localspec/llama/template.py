"""Prompts as tokens: the target's own chat template from its GGUF, or raw completion text.

Message contents are tokenized with special=False, so text that looks like a control token
(`<|im_end|>`) stays text; only the template's own markup becomes control tokens.
"""

from __future__ import annotations

import re

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from localspec.errors import LocalspecError
from localspec.llama.model import Model

Message = dict  # {"role": str, "content": str, optional "tokens": list[int] (content already tokenized)}
_SLOT = "\x00localspec-slot-{}\x00"


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


def chat_tokens(model: Model, messages: list[Message], *, add_generation_prompt: bool = True) -> list[int]:
    """The conversation rendered by the model's chat template, as tokens.

    A message carrying "tokens" contributes those instead of re-tokenizing its content, so a
    generated reply is fed back exactly as it was sampled and the KV cache prefix still matches.
    """
    fmt = _formatter(model)
    fmt.add_generation_prompt = add_generation_prompt
    slotted = [{"role": m["role"], "content": _SLOT.format(i)} for i, m in enumerate(messages)]
    rendered = _render(fmt, slotted)
    parts = re.split("\x00localspec-slot-(\\d+)\x00", rendered)
    if len(parts) != 2 * len(messages) + 1:  # the template transforms contents: render them in place
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        return model.tokenize(_render(fmt, plain), special=True)
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if i % 2:
            m = messages[int(part)]
            tokens += m["tokens"] if "tokens" in m else model.tokenize(m["content"], special=False)
        elif part:
            tokens += model.tokenize(part, special=True)
    return tokens


def _render(fmt: Jinja2ChatFormatter, messages: list[Message]) -> str:
    """The template's text; a template that refuses the messages (roles that do not alternate) is a LocalspecError."""
    try:
        return fmt(messages=messages).prompt  # type: ignore[arg-type]
    except jinja2.TemplateError as e:
        raise LocalspecError(f"the model's chat template refused these messages: {e}") from None


def raw_tokens(model: Model, text: str) -> list[int]:
    """Plain completion: the text as-is, with BOS where the model wants one (as create_completion does)."""
    return model.tokenize(text, add_bos=True, special=False)
