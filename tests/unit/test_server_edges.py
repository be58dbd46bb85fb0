"""Small things clients meet, model-free (the stand-in answers): HEAD /health, a key that is not ASCII,
tool_choice "required" with no tools, errors named as clients name fields, and hostile JSON anywhere in a body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.standin import Served, StandIn, serving

KEY = "clé-ключ-鍵"
AUTH = {b"Authorization": f"Bearer {KEY}".encode()}  # UTF-8 bytes, as curl and the SDKs send it


@pytest.fixture
def served() -> Iterator[Served]:
    with serving(StandIn(), api_key=KEY) as s:
        yield s


def test_head_health_answers_as_get_does(served: Served) -> None:
    assert httpx.head(f"{served.url}/health").status_code == 200


def test_a_key_that_is_not_ascii_matches_as_clients_send_it(served: Served) -> None:
    url = f"{served.url}/v1/models"
    assert httpx.get(url, headers=AUTH).status_code == 200
    assert httpx.get(url, headers={"Authorization": "Bearer cle"}).status_code == 401


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
        ("/v1/responses", {"input": "hi", "tool_choice": "required"}),
    ],
)
def test_required_tool_choice_without_tools_is_a_400(served: Served, path: str, body: dict) -> None:
    answer = httpx.post(f"{served.url}{path}", json={"model": "standin", **body}, headers=AUTH)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "tool_choice"


def _post(served: Served, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served.url}{path}", json={"model": "standin", **body}, headers=AUTH)


def test_a_responses_input_error_names_where_it_is_and_what_fits_there(served: Served) -> None:
    bad = _post(served, "/v1/responses", {"input": [{"type": "message", "role": "user", "content": 5}]})
    error = bad.json()["error"]
    assert bad.status_code == 400 and error["param"] == "input.0.message.content", error
    assert "valid string" in error["message"] and "valid list" in error["message"]
    assert "str" not in error["param"].split(".")


def test_context_errors_name_the_responses_fields() -> None:
    s = Served(StandIn(), n_ctx=100)
    try:
        long = httpx.post(f"{s.url}/v1/responses", json={"model": "standin", "input": "word " * 200})
        assert long.status_code == 400 and long.json()["error"]["param"] == "input"
        capped = {"model": "standin", "input": "hi", "max_output_tokens": 500}
        over = httpx.post(f"{s.url}/v1/responses", json=capped)
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_output_tokens"
        assert "max_output_tokens = 500" in over.json()["error"]["message"]
        tool = {"type": "function", "function": {"name": "f", "description": "word " * 200}}
        chat = {"model": "standin", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
        described = httpx.post(f"{s.url}/v1/chat/completions", json=chat)  # the tools count toward the context
        assert described.status_code == 400 and described.json()["error"]["code"] == "context_length_exceeded"
    finally:
        s.stop()


BASES = {
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    },
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/responses": {
        "input": [{"type": "message", "role": "user", "content": "hi"}],
        "max_output_tokens": 16,
        "metadata": {"k": "v"},
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    },
}
HOLE = "__hostile__"


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a body a value sits."""
    if isinstance(value, dict):
        return [path] + [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [path] + [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path]


def _with_hole(value: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return HOLE
    copy = value.copy()
    copy[path[0]] = _with_hole(value[path[0]], path[1:])
    return copy


@given(data=st.data())
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_deep_nesting_and_numbers_json_has_no_name_for_are_400s_anywhere(served: Served, data: st.DataObject) -> None:
    """A value nested past the limit (arrays or objects, up to 5,000 deep) or a bare NaN/Infinity, put anywhere in
    a valid body of each endpoint: an OpenAI-shaped 400, and the server healthy after it."""
    path = data.draw(st.sampled_from(sorted(BASES)))
    where = data.draw(st.sampled_from(_leaves(BASES[path])[1:]))
    depth = data.draw(st.integers(129, 5000))
    hostile = data.draw(
        st.sampled_from(
            ["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth, "NaN", "Infinity", "-Infinity"]
        )
    )
    body = json.dumps({"model": "standin", **_with_hole(BASES[path], where)}).replace(f'"{HOLE}"', hostile)
    answer = httpx.post(
        f"{served.url}{path}", content=body, headers={**AUTH, b"Content-Type": b"application/json"}, timeout=30
    )
    assert answer.status_code == 400, (where, hostile[:20], answer.text[:300])
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert httpx.head(f"{served.url}/health").status_code == 200


PREDICTION = {"prediction": {"type": "content", "content": "hi there"}}


@pytest.mark.parametrize(
    ("path", "body", "texts"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, 1),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **PREDICTION}, 2),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 3}, 1),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 3, **PREDICTION}, 2),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 16, "stream": True}, 1),
    ],
)
def test_a_request_is_prepared_and_tokenized_once(served: Served, path: str, body: dict, texts: int) -> None:
    """One preparation a request; its prompt, and its prediction where it has one, tokenized once each."""
    spec = served.spec
    before = spec.prepared, spec.tokenized
    assert _post(served, path, body).status_code == 200
    assert (spec.prepared, spec.tokenized) == (before[0] + 1, before[1] + texts)


def test_cache_keys_reach_the_prompt_cache_as_each_api_names_them() -> None:
    """OpenAI's prompt_cache_key (chat and Responses; a day's hold with prompt_cache_retention "24h"), and Anthropic's
    cache_control breakpoints under the client's user id (the longest ttl's hold); none: no key."""
    with serving(StandIn()) as served:
        _cache_keys(served)


def _cache_keys(served: Served) -> None:
    openai_client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
    spec, hi = served.spec, [{"role": "user", "content": "hi"}]
    openai_client.chat.completions.create(model="standin", messages=hi, max_tokens=2, prompt_cache_key="conv-1")  # type: ignore[arg-type]
    assert spec.options is not None and (spec.options.cache_key, spec.options.cache_hold) == ("openai:conv-1", 600)
    openai_client.responses.create(
        model="standin", input="hi", max_output_tokens=16, prompt_cache_key="conv-2", prompt_cache_retention="24h"
    )
    assert (spec.options.cache_key, spec.options.cache_hold) == ("openai:conv-2", 86400)
    openai_client.chat.completions.create(model="standin", messages=hi, max_tokens=2)  # type: ignore[arg-type]
    assert spec.options.cache_key is None
    claude = anthropic.Anthropic(base_url=served.url, api_key="none")
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    hello = [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]
    claude.messages.create(model="m", max_tokens=2, system=system, messages=hello, metadata={"user_id": "u1"})  # type: ignore[call-overload]
    assert (spec.options.cache_key, spec.options.cache_hold) == ("anthropic:u1", 3600)
    spec._engine.cache_miss = "no entry shares its start"
    claude.messages.create(model="m", max_tokens=2, messages=hi)  # type: ignore[arg-type]
    assert spec.options.cache_key is None
    assert served.log[-1].endswith("length; the prompt cache missed: no entry shares its start"), served.log[-1]
    bad = {"model": "m", "max_tokens": 2, "messages": hi, "cache_control": {"type": "forever"}}
    refused = httpx.post(f"{served.url}/v1/messages", json=bad)
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"


def test_a_stream_that_ends_while_its_reader_stops_leaves_nothing_to_log() -> None:
    """The keepalive's wait for the next piece may end (the client gone) just as the reader stops: what it ended
    with is taken, not left for asyncio to log as a task exception never retrieved (a traceback in the log)."""
    import asyncio
    import gc

    from localspec.frontends.server.service import ticking
    from localspec.frontends.server.worker import ClientGone

    logged: list[dict] = []

    async def stream() -> Any:
        await asyncio.sleep(0.05)
        raise ClientGone
        yield  # an async generator

    async def read() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: logged.append(context))
        items = ticking(stream(), 0.01)
        assert await items.__anext__() is None  # a keepalive while the piece is awaited
        await asyncio.sleep(0.1)  # the piece's wait ends meanwhile, with the client gone
        await items.aclose()
        gc.collect()

    asyncio.run(read())
    gc.collect()
    assert not logged, logged
