"""The prompt cache and earlier answers with the real models: restored prompts give the same bits as prefilled
ones, a conversation resumed after another (and after a restart) answers as if never left, and an answer asked for
again is drafted from the first one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from support.same import assert_same_tokens

from localspec.api import LocalSpec, Message, Stats
from localspec.llama.model import Model
from localspec.llama.prompts import PromptCache

RULES = "You review Python code. " + " ".join(
    f"Rule {i}: prefer clear names, short functions, type hints and docstrings." for i in range(40)
)
QUESTION = "Write a Python function that merges two sorted lists into one sorted list."


def test_a_restored_prompt_has_a_fresh_prefills_logits(target_path: Path, tmp_path: Path) -> None:
    model = Model(target_path, n_ctx=2048)
    first = model.tokenize(RULES)  # two batches of a prefill
    longer = first + model.tokenize(" Now review this: def f(x): return x+1")

    def fresh(tokens: list[int]) -> np.ndarray:
        model.prompts = None
        model.reset()
        return model.sync(tokens, 1, prompt=True).copy()

    want_first, want_longer = fresh(first), fresh(longer)
    model.prompts = PromptCache(model.kv_key, ram=2**30, disk=2**30, root=tmp_path)
    model.reset()
    model.sync(first, 1, prompt=True)
    model.remember()
    model.prompts.flush()
    for tokens, want in ((first, want_first), (longer, want_longer)):
        model.prompts = PromptCache(model.kv_key, ram=0, disk=2**30, root=tmp_path)  # a restart: the disk alone
        model.reset()
        decoded = model.n_decoded
        got = model.sync(tokens, 1, prompt=True)
        assert model.n_decoded - decoded < len(tokens) - len(first) + 32  # restored, not prefilled
        assert np.array_equal(got, want)  # to the bit


def _conversation(spec: LocalSpec, turns: list[str], answers: list[str], **kw: Any) -> tuple[str, Stats]:
    """The next answer of a conversation under RULES: its text and figures."""
    messages: list[Message] = [{"role": "system", "content": RULES}]
    for turn, answer in zip(turns, answers, strict=False):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": turns[len(answers)]})
    run = spec.generate(messages, max_tokens=40, **kw)
    return run.result(), run.stats


def test_a_conversation_resumed_after_another_and_a_restart_answers_as_if_never_left(target_path: Path) -> None:
    turns = [QUESTION, "Now add type hints and a docstring."]
    other = ["Write a haiku about the sea."]
    for kw in ({"temperature": 0}, {"temperature": 0.8, "seed": 7}):
        spec = LocalSpec.load(str(target_path), draft="copier", ctx=2048)
        first, _ = _conversation(spec, turns, [], **kw)
        uninterrupted, _ = _conversation(spec, turns, [first], **kw)
        spec = LocalSpec.load(str(target_path), draft="copier", ctx=2048)  # another conversation, then a restart
        assert _conversation(spec, turns, [], **kw)[0] == first
        _conversation(spec, other, [], **kw)
        spec = LocalSpec.load(str(target_path), draft="copier", ctx=2048)
        resumed, st = _conversation(spec, turns, [first], **kw)
        assert resumed == uninterrupted
        assert st.cached_tokens >= 0.9 * st.prompt_tokens, st


def test_an_answer_asked_for_again_is_drafted_from_the_first(target_path: Path) -> None:
    spec = LocalSpec.load(str(target_path), draft="copier", ctx=2048, temperature=0)
    alone = spec.generate(QUESTION, max_tokens=120, max_draft=0)
    want = alone.result()
    run = spec.generate(QUESTION, max_tokens=120)
    got = run.result()
    recalled = run.stats.accepted_by.get("recall", 0)
    assert recalled >= 0.5 * run.stats.completion_tokens, run.stats  # drafting happened: from the first answer
    tokens = spec.tokens(QUESTION)
    assert_same_tokens(spec.engine.target, tokens, spec.tokenize(got), spec.tokenize(want))


def _chat(spec: LocalSpec, system: str, turns: list[str], answers: list[str], key: str | None) -> tuple[str, Stats]:
    messages: list[Message] = [{"role": "system", "content": system}]
    for turn, answer in zip(turns, answers, strict=False):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    run = spec.generate([*messages, {"role": "user", "content": turns[len(answers)]}], max_tokens=4, cache_key=key)
    return run.result(), run.stats


def test_a_cache_key_keeps_its_conversation_through_other_traffic_and_a_miss_says_why(target_path: Path) -> None:
    rules = " ".join(RULES.split(". ")[:12])  # about 170 tokens a conversation: a state of about 5 MB
    turns = [QUESTION, "Now add type hints and a docstring."]
    resumed: dict[str | None, Stats] = {}
    for key in ("session-1", None):
        # a memory budget of one conversation's state, no disk tier
        spec = LocalSpec.load(str(target_path), no_draft=True, ctx=1024, cache_ram=7, cache_disk=0, temperature=0)
        first, _ = _chat(spec, rules, turns, [], key)
        for i in range(2):  # other conversations, with no key: their system prompts share nothing with `rules`
            _chat(spec, f"{i}. You write short poems, {rules}", ["A haiku."], [], None)
        _, resumed[key] = _chat(spec, rules, turns, [first], key)
    held, evicted = resumed["session-1"], resumed[None]
    assert held.cached_tokens >= 0.8 * held.prompt_tokens and held.cache_miss is None, held
    assert evicted.cached_tokens < 0.2 * evicted.prompt_tokens, evicted  # the same traffic without a key
    assert evicted.cache_miss is not None and "evicted by the cache's budget" in evicted.cache_miss, evicted
