"""The Responses API (`POST /v1/responses`, what Codex CLI speaks), model-free: a request read as a chat, and the
real app over a stand-in engine answering the official openai client, plain and streamed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.standin import Served, StandIn, serving

from localspec.frontends.server.responses import ResponsesRequest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
AGENTS = {
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [{"type": "function", "name": "close", "parameters": {"type": "object", "properties": {}}}],
}


def _request(**body: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **body})


def test_a_codex_history_reads_as_a_chat() -> None:
    """Instructions and leading developer messages are one system message; calls are the assistant's tool calls
    (a namespace's named `namespace.function`), their outputs tool messages; reasoning is left out."""
    req = _request(
        instructions="Be brief.",
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"role": "user", "content": [{"type": "input_text", "text": "Close it."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "function_call", "call_id": "c1", "name": "close", "namespace": "agents", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "closed"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        ],
        tools=[WEATHER, AGENTS, {"type": "web_search", "external_web_access": False}],
    )
    messages = req.messages()
    assert messages[0] == {"role": "system", "content": "Be brief.\n\nYou are Codex."}
    assert messages[1] == {"role": "user", "content": "Close it."}
    calls = messages[2]["tool_calls"]
    assert messages[2]["role"] == "assistant" and [c["function"]["name"] for c in calls] == [
        "agents.close",
        "get_weather",
    ]
    assert messages[3] == {"role": "tool", "content": "closed", "tool_call_id": "c1", "name": "agents.close"}
    assert messages[4]["content"] == "rain" and messages[5] == {"role": "assistant", "content": "Done."}
    options = req.options()
    assert [t["function"]["name"] for t in options["tools"]] == ["get_weather", "agents.close"]
    assert req.skipped() == ["web_search"]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
        ({"input": "hi", "background": True}, "background"),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objectx"}}}},
            "text",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(served: Served, body: dict[str, Any], where: str) -> None:
    """What the client gets: a 400 whose param names the field (not the validator's own view of it)."""
    answer = httpx.post(f"{served.url}/v1/responses", json={"model": "standin", **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"].split(".")[0] == where, answer.json()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serving(StandIn(piece="word ", pace=0.001)) as s:
        yield s


def test_plain_and_streamed_answers_as_the_openai_client_reads_them(served: Served) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
    plain = client.responses.create(model="standin", input="Hi", max_output_tokens=3)
    assert plain.output_text == "word word word " and plain.status == "incomplete"
    assert plain.usage is not None and plain.usage.output_tokens == 3
    assert plain.incomplete_details is not None and plain.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model="standin", input="Hi", max_output_tokens=4, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert deltas == done.output_text == "word word word word "
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_skipped_tools_are_named_and_an_error_is_openai_shaped(served: Served) -> None:
    body = {"model": "standin", "input": "Hi", "max_output_tokens": 2, "tools": [{"type": "image_generation"}]}
    r = httpx.post(f"{served.url}/v1/responses", json=body)
    assert r.status_code == 200 and r.headers["x-localspec-skipped-tools"] == "image_generation"
    assert r.json()["localspec"]["skipped_tools"] == ["image_generation"] and r.json()["tools"] == []
    bad = httpx.post(f"{served.url}/v1/responses", json={**body, "previous_response_id": "resp_1"})
    error = bad.json()["error"]
    assert bad.status_code == 404 and error["param"] == "previous_response_id" and "stored" in error["message"]
    assert httpx.post(f"{served.url}/v1/responses", json={**body, "model": "other"}).status_code == 404


def test_a_call_of_a_namespace_function_maps_back() -> None:
    """The model calls `agents.close`; the client gets `close` in namespace `agents`, streamed and whole."""
    call = '<tool_call>\n{"name": "agents.close", "arguments": {"target": "a1"}}\n</tool_call>'
    s = Served(StandIn(piece=call))
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none")
        whole = client.responses.create(model="standin", input="Close a1.", tools=[AGENTS], max_output_tokens=1)
        [item] = whole.output
        assert item.type == "function_call" and (item.name, item.namespace) == ("close", "agents")
        assert json.loads(item.arguments) == {"target": "a1"}
        events = list(
            client.responses.create(
                model="standin", input="Close a1.", tools=[AGENTS], max_output_tokens=1, stream=True
            )
        )
        assert [e.type for e in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        done = events[-1].response.output[0]
        assert done.type == "function_call" and (done.name, done.namespace) == ("close", "agents")
    finally:
        s.stop()
