"""Anthropic's Messages API (/v1/messages), model-free: the official anthropic SDK against the real app over the
stand-in engine (whole answers, streams, a tool round, count_tokens, errors in Anthropic's shape, the key in
x-api-key, Claude Code's first request)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from support.standin import Served, StandIn, serving, until

from localspec.frontends.server.messages import MessagesRequest

KEY = "sk-local"
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]


@pytest.fixture
def served() -> Iterator[Served]:
    with serving(StandIn(), api_key=KEY) as s:
        yield s


def _text(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if isinstance(b, anthropic.types.TextBlock))


def _client(served: Served, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.url, api_key=key, max_retries=0)


def test_a_message_whole_and_streamed(served: Served) -> None:
    """Any model name is answered by the one served; the text, stop reason and usage in Anthropic's shape; the
    stream's events accumulate to the same message."""
    client = _client(served)
    ask = {"model": "claude-sonnet-4-5", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    message = client.messages.create(**ask)  # type: ignore[call-overload]
    assert message.type == "message" and message.role == "assistant" and message.model == "standin"
    assert [b.type for b in message.content] == ["text"] and _text(message) == "word " * 3
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 0
    with client.messages.stream(**ask) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert _text(streamed) == "word " * 3 and streamed.stop_reason == "max_tokens"
    assert streamed.usage.output_tokens == 3


def test_a_tool_round(served: Served) -> None:
    """A call comes back as a tool_use block (its input an object; streamed as one input_json_delta), stop reason
    tool_use; the history with the tool_use and its tool_result goes to the template as a call and its result."""
    served.spec._engine.piece = CALL
    client = _client(served)
    ask = {"model": "x", "max_tokens": 1, "tools": TOOLS, "messages": [{"role": "user", "content": "read a.py"}]}
    message = client.messages.create(**ask)  # type: ignore[call-overload]
    use = message.content[-1]
    assert message.stop_reason == "tool_use" and use.type == "tool_use"
    assert use.name == "read_file" and use.input == {"path": "a.py"}
    with client.messages.stream(**ask) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    assert streamed.content[-1].type == "tool_use" and streamed.content[-1].input == {"path": "a.py"}
    history = [
        {"role": "user", "content": "read a.py"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "s"}, use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "x = 1"}]},
    ]
    request = MessagesRequest.model_validate(
        {**ask, "messages": history, "system": [{"type": "text", "text": "Be brief."}]}
    )
    chat = request.chat()
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool"]
    assert chat[2]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "a.py"}'}
    assert chat[3] == {"role": "tool", "tool_call_id": use.id, "content": "x = 1"}
    served.spec._engine.piece = "word "
    again = client.messages.create(**{**ask, "messages": history})  # type: ignore[call-overload]
    assert _text(again) == "word "


def test_claude_codes_billing_header_is_not_part_of_the_prompt() -> None:
    """Its first system block changes with Claude Code's version: at the prompt's start it would make every
    request a cache miss."""
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.337.c19; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ]
    request = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 8, "system": system, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert request.chat()[0] == {"role": "system", "content": "You are Claude Code."}


def test_count_tokens_and_a_length_beyond_the_room(served: Served) -> None:
    """count_tokens counts the templated prompt; max_tokens beyond the context's room is answered up to the room
    (Claude Code asks for 32,000), not refused."""
    client = _client(served)
    counted = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "one two three"}])
    assert counted.input_tokens == 3 + 4  # the stand-in: a word a token, and four for the template
    served.spec.n_ctx = 12
    with client.messages.stream(model="m", max_tokens=32000, messages=[{"role": "user", "content": "hi"}]) as stream:
        message = stream.get_final_message()  # the SDK streams a request this long, as Claude Code does
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 12 - 5


def test_errors_in_anthropics_shape(served: Served) -> None:
    """A wrong key, an image, a bad field: Anthropic's error shape and the SDK's exception; the key in x-api-key
    (the SDK's way) or as a bearer token; Claude Code's first request answered."""
    with pytest.raises(anthropic.AuthenticationError) as denied:
        _client(served, "wrong").messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    image: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(served).messages.create(
            model="m", max_tokens=1, messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]
        )
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and "messages.0.content.1" in error["message"]
    bad = httpx.post(f"{served.url}/v1/messages", headers={"x-api-key": KEY}, json={"model": "m", "messages": []})
    assert bad.status_code == 400 and bad.json()["type"] == "error", bad.text
    assert set(bad.json()["error"]) == {"type", "message"}
    bearer = httpx.post(
        f"{served.url}/v1/messages",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert bearer.status_code == 200 and bearer.json()["content"][0]["text"] == "word "
    assert httpx.get(f"{served.url}/api/hello").status_code == 200
    tool = {"name": "f", "input_schema": {"type": "objectx"}}
    schema = httpx.post(
        f"{served.url}/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]},
    )
    assert schema.status_code == 400 and "tools.0.input_schema" in schema.json()["error"]["message"], schema.text


def test_the_stop_string_found_is_named() -> None:
    """The answer's text ends before the first stop string found, which the stats name (stop_reason
    stop_sequence and stop_sequence in Anthropic's answer)."""
    from localspec.core.text import TextStream

    stream = TextStream(["END", "two"])
    shown = stream.feed(b"one tw") + stream.feed(b"o three END")
    assert shown == "one " and stream.stopped and stream.matched == "two"


def test_system_messages_in_the_conversation_join_the_system_prompt() -> None:
    """Claude Code adds a fixed system message after a session's first question: gathered into the system prompt,
    the prompts of two sessions part only at their questions."""
    asks = [
        MessagesRequest.model_validate(
            {
                "model": "m",
                "max_tokens": 8,
                "system": "You are Claude Code.",
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "system", "content": [{"type": "text", "text": "Agents: Explore, Plan."}]},
                ],
            }
        ).chat()
        for question in ("What is 2+2?", "What is 3+5?")
    ]
    assert asks[0][0] == asks[1][0] == {"role": "system", "content": "You are Claude Code.\n\nAgents: Explore, Plan."}
    assert [m["role"] for m in asks[0]] == ["system", "user"]


def test_a_long_silence_is_kept_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """While nothing comes (a long prefill), a stream sends pings and empty text deltas (Claude Code gives up after
    300 s without an event its SDK passes on, and the SDK drops pings); the answer is the same text. OpenAI's streams
    send SSE comments."""
    from localspec.frontends.server import service

    monkeypatch.setattr(service, "KEEPALIVE_SECONDS", 0.05)
    s = Served(StandIn(pace=0.3))
    try:
        body = {"model": "m", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        raw = httpx.post(f"{s.url}/v1/messages", json=body, timeout=30).text
        assert raw.count("event: ping") >= 3, raw  # the opening's, then the silence's
        chat = {"model": "standin", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{s.url}/v1/chat/completions", json=chat, timeout=30).text.count(": keepalive") >= 2
        ask = {k: v for k, v in body.items() if k != "stream"}
        assert raw.count('"text_delta", "text": ""') >= 2 and raw.count("event: content_block_start") == 1, raw
        with anthropic.Anthropic(base_url=s.url, api_key="x").messages.stream(**ask) as stream:  # type: ignore[arg-type]
            kept = stream.get_final_message()
        assert _text(kept) == "word " * 2 and kept.usage.output_tokens == 2
    finally:
        s.stop()


def test_a_client_gone_during_the_silence_frees_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that leaves while only pings come: its generation stops, and the next request is answered."""
    from localspec.frontends.server import service

    monkeypatch.setattr(service, "KEEPALIVE_SECONDS", 0.05)
    with serving(StandIn(pace=0.5)) as s:
        body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", f"{s.url}/v1/messages", json=body, timeout=30) as answer:
            lines = answer.iter_lines()
            while "ping" not in next(lines):  # the opening's ping
                pass
            while "ping" not in next(lines):  # one from the silence
                pass
        until(lambda: any(" 499 " in line for line in s.log), "the server to see the client go")
        s.spec._engine.pace = 0.001
        again = httpx.post(f"{s.url}/v1/messages", json={**body, "stream": False, "max_tokens": 2}, timeout=30)
        assert again.status_code == 200 and again.json()["usage"]["output_tokens"] == 2
