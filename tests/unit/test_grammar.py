"""Constrained decoding, tool calls and log-probabilities without a model: a toy byte vocabulary for the
grammar engine, text for the tool-call parser, numbers for the rest."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llguidance import LLTokenizer, TokenizerWrapper

from localspec.core.grammar import Constraint, GrammarError, compile_grammar, json_schema_grammar
from localspec.core.sampling import Dist, InvariantSampling, SamplerSettings, process, token_logprob
from localspec.core.tool_calls import (
    ToolCallStream,
    call_grammar,
    parse_tool_calls,
    template_supports_tools,
)
from localspec.drafting.forced import ForcedDrafter

WORDS = [b'{"', b"name", b'":', b' "', b'",', b"age", b'"}', b"true", b"<tool_call>", b"</tool_call>"]


class ToyTokenizer:
    """Every byte is a token, then a few words, then the end-of-sequence token; greedy longest match."""

    def __init__(self) -> None:
        self.tokens = [bytes([b]) for b in range(256)] + WORDS + [b"\xff</s>"]
        self.eos_token_id, self.bos_token_id = len(self.tokens) - 1, None
        self.special_token_ids = [self.eos_token_id]

    def __call__(self, text: bytes) -> list[int]:
        out, i = [], 0
        while i < len(text):
            best = max(
                (t for t in range(len(self.tokens) - 1) if text.startswith(self.tokens[t], i)),
                key=lambda t: len(self.tokens[t]),
            )
            out.append(best)
            i += len(self.tokens[best])
        return out


TOY = ToyTokenizer()
LL = LLTokenizer(TokenizerWrapper(TOY))
N = len(TOY.tokens)
EOS = TOY.eos_token_id
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _text(tokens: list[int]) -> bytes:
    return b"".join(TOY.tokens[t] for t in tokens if t != EOS)


def test_a_schema_masks_everything_it_does_not_allow() -> None:
    """Where the grammar forces text, only its canonical spelling is allowed: a forced draft is the target's."""
    c = Constraint(LL, json_schema_grammar(SCHEMA), N)
    allowed = c.allowed()
    assert list(np.flatnonzero(allowed)) == TOY(b'{"')
    masked = c.mask(np.zeros(N, np.float32))
    assert np.isneginf(masked[~allowed]).all() and (masked[allowed] == 0).all()


def test_forced_tokens_and_valid_prefixes() -> None:
    """The key names and separators of a compact JSON object are forced; a draft is valid as far as the
    grammar goes, and checking it consumes nothing."""
    c = Constraint(LL, json_schema_grammar(SCHEMA), N)
    assert _text(c.forced()) == b'{"name":'  # not the ' "' after it: a token may join it to the string
    for t in TOY(b'{"name": "'):
        c.advance(t)
    draft = TOY(b'Ada", "age": x')
    n = c.valid_prefix(draft)
    assert _text(draft[:n]) == b'Ada", "age": '
    assert _text(c.forced()) == b""  # a string's contents are free; nothing was consumed
    for t in TOY(b'Ada"'):
        c.advance(t)
    assert _text(c.forced()).startswith(b', "age": ')
    with pytest.raises(GrammarError):
        c.advance(ord("x"))


def test_the_forced_drafter_proposes_what_is_forced() -> None:
    c = Constraint(LL, json_schema_grammar(SCHEMA), N)
    d = ForcedDrafter(c)
    forced = c.forced()
    assert d.draft([], 3, SamplerSettings(), InvariantSampling(0)) == forced[:3]
    assert len(d.offer([], 64, 64, None).survival) == len(forced) and d.offer([], 2, 64, None).survival[-1] < 1


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_masked_verification_emits_the_target_alone_tokens(temperature: float) -> None:
    """Under a grammar, whatever is drafted (forced tokens, a wrong copy, nothing), every emitted token is
    the one the target alone picks from its masked distribution at that position; every answer parses."""
    rng = np.random.default_rng(5)
    sampler = SamplerSettings(temperature, top_k=0, top_p=1.0, min_p=0.0)
    bias = np.full(N, -4.0, np.float32)
    bias[[*range(48, 58), *TOY(b'{"name": "Ada", "age": 7}')]] = 2.0  # a model that likes JSON and digits
    for seed in range(20):
        logits_at = [bias + rng.normal(0, 1, N).astype(np.float32) for _ in range(200)]
        sampling = InvariantSampling(seed)
        c, want = Constraint(LL, json_schema_grammar(SCHEMA), N), list[int]()
        while not want or want[-1] != EOS:  # the target alone
            want.append(sampling.pick(process(c.mask(logits_at[len(want)]), sampler), len(want)))
            c.advance(want[-1])
        c, out = Constraint(LL, json_schema_grammar(SCHEMA), N), list[int]()
        while not out or out[-1] != EOS:
            kind = rng.integers(3)
            draft = c.forced() if kind == 0 else list(rng.integers(0, N - 1, rng.integers(1, 5))) if kind == 1 else []
            draft = draft[: c.valid_prefix(draft)]
            rows = logits_at[len(out) :]

            def p_at(i: int, draft: list[int] = draft, c: Constraint = c, rows: list[np.ndarray] = rows) -> Dist:
                if i:
                    c.advance(draft[i - 1])
                return process(c.mask(rows[i]), sampler)

            tokens, _ = sampling.verify(p_at, draft, len(out))
            c.advance(tokens[-1])
            out += tokens
        assert out == want
        json.loads(_text(out))


def test_bad_grammars_are_refused_with_the_reason() -> None:
    with pytest.raises(GrammarError, match="objectx"):
        json_schema_grammar({"type": "objectx"})
    with pytest.raises(GrammarError, match="nope"):
        json_schema_grammar({"type": "object", "properties": {"a": {"$ref": "#/nope"}}})
    with pytest.raises(GrammarError):
        compile_grammar("json_schema", "{not json")
    with pytest.raises(GrammarError):
        compile_grammar("gbnf", 'root ::= "a" (')
    assert compile_grammar("gbnf", 'root ::= "yes" | "no"')
    assert compile_grammar("lark", 'start: "yes" | "no"')
    assert compile_grammar("regex", "[0-9]+")


def test_a_gbnf_grammar_constrains() -> None:
    c = Constraint(LL, compile_grammar("gbnf", 'root ::= "yes" | "no"'), N)
    allowed = np.flatnonzero(c.allowed())
    assert set(allowed) == {ord("y"), ord("n")}


def test_a_required_call_follows_its_function_schema() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": "g"}},
    ]
    grammar = call_grammar(tools, "f", '"<tool_call>"', '"</tool_call>"')
    c = Constraint(LL, grammar, N)
    good = TOY(b'<tool_call>\n{"name": "f", "arguments": {"name": "x", "age": 3}}\n</tool_call>')
    assert c.valid_prefix(good) == len(good)
    bad = TOY(b'<tool_call>\n{"name": "g"')
    assert c.valid_prefix(bad) < len(bad)
    bad_args = TOY(b'<tool_call>\n{"name": "f", "arguments": {"name": 3')
    assert c.valid_prefix(bad_args) < len(bad_args)


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (CALL, "", [("get_weather", {"city": "Paris"})]),
        ("Let me look.\n" + CALL + "\n" + CALL, "Let me look.", [("get_weather", {"city": "Paris"})] * 2),
        (
            '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```',
            "",
            [("get_weather", {"city": "Oslo"})],
        ),
        ('{"name": "get_weather", "parameters": {"city": "Rome"}}', "", [("get_weather", {"city": "Rome"})]),
        ('{"name": "other_tool", "arguments": {}}', '{"name": "other_tool", "arguments": {}}', []),
        ('<tool_call>\n{"name": "get_weather", "argu', '<tool_call>\n{"name": "get_weather", "argu', []),
        ("It is sunny.", "It is sunny.", []),
    ],
)
def test_tool_calls_are_parsed_from_the_answer(text: str, content: str, calls: list[tuple[str, dict]]) -> None:
    got_content, got = parse_tool_calls(text, ["get_weather"])
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert all(c.id.startswith("call_") for c in got) and len({c.id for c in got}) == len(got)


def test_a_stream_holds_back_calls_and_only_calls() -> None:
    for answer, streamed in [
        ("Checking the weather.\n" + CALL, "Checking the weather.\n"),
        ("It is sunny <b>today</b>.", "It is sunny <b>today</b>."),
        ('{"answer": 42}', '{"answer": 42}'),  # JSON that is no call comes out at the end
    ]:
        s = ToolCallStream(["get_weather"])
        out = "".join(s.feed(answer[i : i + 3]) for i in range(0, len(answer), 3))
        rest, calls = s.finish()
        assert out + rest == streamed
        assert bool(calls) == (CALL in answer)


def test_which_templates_have_tools() -> None:
    assert template_supports_tools("{% if tools %}<tools>{{ tools }}</tools> use <tool_call></tool_call>{% endif %}")
    assert not template_supports_tools("{% for m in messages %}{{ m.content }}{% endfor %}")


def test_logprobs_are_the_log_softmax() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 1000).astype(np.float32)
    e = token_logprob(logits, 7, 5)
    x = logits.astype(np.float64)
    want = x - x.max() - np.log(np.exp(x - x.max()).sum())
    assert e.token == 7 and e.logprob == pytest.approx(want[7])
    assert [t for t, _ in e.top] == list(np.argsort(-want)[:5])
    assert [lp for _, lp in e.top] == pytest.approx(sorted(want, reverse=True)[:5])
    masked = np.full(1000, -np.inf, np.float32)
    masked[[3, 9]] = [1.0, 2.0]
    e = token_logprob(masked, 9, 5)
    assert [t for t, _ in e.top] == [9, 3] and e.logprob == pytest.approx(-np.log1p(np.exp(-1.0)))
    assert token_logprob(logits, 7, 0).top == ()


def test_concurrent_compiles_leave_the_processs_thread_stack_size_as_it_was() -> None:
    """The compile thread's large stack is the process's setting while one starts: compiles at once must put it
    back as they found it, or every later thread reserves 512 MiB."""
    import threading

    from localspec.core.grammar import json_schema_grammar

    before = threading.stack_size()
    barrier = threading.Barrier(8)

    def compile_one() -> None:
        barrier.wait()
        for _ in range(5):
            json_schema_grammar({"type": "object", "properties": {"a": {"type": "integer"}}})

    threads = [threading.Thread(target=compile_one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert threading.stack_size() == before
