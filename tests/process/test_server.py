"""`localspec serve` as clients use it: the real server on a free local port, the official openai client."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import openai
import pytest
from stall_check import UNREAD, head, raw, request  # the raw-socket clients of scripts/stall_check.py
from support.commands import run_cli
from support.same import assert_same_constrained, assert_same_tokens
from support.server import CTX, MODEL, Server

from localspec import LocalSpec
from localspec.core.grammar import json_schema_grammar
from localspec.core.sampling import SamplerSettings
from localspec.llama.model import Model
from localspec.llama.template import chat_tokens


@pytest.fixture(scope="module")
def server(target_path: Path, draft_path: Path) -> Iterator[Server]:
    s = Server()
    yield s
    assert s.stop() == 0  # SIGTERM shuts it down cleanly
    assert "Traceback" not in s.log_path.read_text()


def _same(
    target: Model,
    prompt: str | list[dict[str, Any]],
    got: str,
    want: str,
    *,
    raw: bool = False,
    sampler: SamplerSettings | None = None,
    seed: int = 0,
) -> None:
    """Texts equal, or parting at a near tie of the target's scores (the server's drafts and cached prefixes
    depend on what it served before, and batch shapes can flip a near tie)."""
    if got == want:
        return
    if isinstance(prompt, str):
        tokens = (
            target.tokenize(prompt, add_bos=True) if raw else chat_tokens(target, [{"role": "user", "content": prompt}])
        )
    else:  # a conversation
        tokens = chat_tokens(target, prompt)
    assert_same_tokens(target, tokens, target.tokenize(got), target.tokenize(want), sampler, seed)


def _chat(client: openai.OpenAI, content: str, **kw: Any) -> Any:
    """A chat completion of one user message (whole, or streamed with stream=True)."""
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


HAIKU = "Write a haiku about autumn leaves."

CODE = (
    'def total(items):\n    """Sum the prices."""\n    result = 0\n    for item in items:\n'
    "        result += item.price\n    return result\n"
)
EDIT = f"Rename the variable result to acc in this code. Reply with the code only.\n\n```python\n{CODE}```"


def test_models_and_health(server: Server) -> None:
    assert [m.id for m in server.client().models.list()] == [MODEL]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"


def test_greedy_chat_equals_generate_no_draft(server: Server, target: Model) -> None:
    reply = _chat(server.client(), EDIT, temperature=0, max_tokens=60)
    alone = run_cli("generate", "--json", "--no-draft", "--temperature", "0", "-n", "60", "--ctx", CTX, EDIT)
    assert alone.returncode == 0, alone.stderr
    _same(target, EDIT, reply.choices[0].message.content, json.loads(alone.stdout)["text"])
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    extra = reply.usage.model_extra["localspec"]
    assert extra["drafted"] > 0 and extra["target_passes"] < reply.usage.completion_tokens  # drafts were verified


def test_streamed_chat_with_usage_equals_the_whole_answer(server: Server, target: Model) -> None:
    whole = _chat(server.client(), HAIKU, temperature=0, max_tokens=40).choices[0].message.content
    chunks = list(
        _chat(server.client(), HAIKU, temperature=0, max_tokens=40, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    _same(target, HAIKU, text, whole)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_completions_streamed_and_not(server: Server, target: Model) -> None:
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=30, temperature=0)
    streamed = client.completions.create(
        model=MODEL,
        prompt="def fibonacci(n):",
        max_tokens=30,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    _same(
        target,
        "def fibonacci(n):",
        "".join(c.choices[0].text for c in chunks if c.choices),
        whole.choices[0].text,
        raw=True,
    )
    assert whole.usage.completion_tokens == 30 and whole.choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 30


def test_stop_max_tokens_and_seed(server: Server, target: Model) -> None:
    client = server.client()
    short = _chat(client, "Count from 1 to 20, one number per line.", temperature=0, max_tokens=5)
    assert short.usage.completion_tokens == 5 and short.choices[0].finish_reason == "length"
    stopped = _chat(client, "Count from 1 to 20, one number per line.", temperature=0, max_tokens=80, stop=["7"])
    assert stopped.choices[0].finish_reason == "stop" and "7" not in stopped.choices[0].message.content
    assert "6" in stopped.choices[0].message.content
    # A seeded request gives the same text each time, and the same as the target alone with that seed (the
    # second request reuses the cached prompt, so batch shapes differ: a near tie is checked where texts part).
    seeded = [_chat(client, EDIT, temperature=0.9, seed=11, max_tokens=60) for _ in range(2)]
    alone = run_cli(
        "generate", "--json", "--no-draft", "--temperature", "0.9", "--seed", "11", "-n", "60", "--ctx", CTX, EDIT
    )
    assert alone.returncode == 0, alone.stderr
    want = json.loads(alone.stdout)["text"]
    for reply in seeded:
        assert (
            reply.usage.model_extra["localspec"]["seed"] == 11 and reply.usage.model_extra["localspec"]["drafted"] > 0
        )
        _same(target, EDIT, reply.choices[0].message.content, want, sampler=SamplerSettings(0.9), seed=11)


def test_prediction_is_used_and_changes_nothing(server: Server, target: Model) -> None:
    client = server.client()
    plain = _chat(client, EDIT, temperature=0, max_tokens=80)
    expected = plain.choices[0].message.content
    good = _chat(client, EDIT, temperature=0, max_tokens=80, prediction={"type": "content", "content": expected})
    _same(target, EDIT, good.choices[0].message.content, expected)
    details = good.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > good.usage.completion_tokens // 2
    assert (
        details.rejected_prediction_tokens <= 2
    )  # OpenAI's counts: the prediction's tokens in the answer, and the rest
    parts = [{"type": "text", "text": "nothing like "}, {"type": "text", "text": "the answer\n" * 8}]
    wrong = _chat(client, EDIT, temperature=0, max_tokens=80, prediction={"type": "content", "content": parts})
    _same(target, EDIT, wrong.choices[0].message.content, expected)
    # partly right: the answer's lines, then lines it does not have
    partly = [*expected.split("\n")[:3], "    unrelated = 1", "    other = 2"]
    half = _chat(
        client, EDIT, temperature=0, max_tokens=80, prediction={"type": "content", "content": "\n".join(partly)}
    )
    _same(target, EDIT, half.choices[0].message.content, expected)
    predicted = len(target.tokenize("\n".join(partly)))
    d = half.usage.completion_tokens_details
    assert d.accepted_prediction_tokens + d.rejected_prediction_tokens == predicted
    assert 0 < d.accepted_prediction_tokens < predicted and d.rejected_prediction_tokens >= len(
        target.tokenize("unrelated = 1")
    )


def test_a_request_can_cap_or_turn_off_drafting(target: Model, draft_path: Path) -> None:
    """llama-server's `speculative.n_max`: 0 answers with the target alone, 2 drafts at most two tokens a round;
    the text is the same every way. A server with a fixed k of 8 drafts whenever it has a proposal (the cost-aware
    choice may find two tokens a round not worth their price), and the answer itself as the prediction always
    has one: capped, its rounds draft one or two tokens; uncapped, more."""
    fixed = Server("--k", "8")
    try:
        client = fixed.client()
        free = _chat(client, EDIT, temperature=0, max_tokens=60)
        text = free.choices[0].message.content or ""
        predicted = {"prediction": {"type": "content", "content": text}}
        answers = {
            n: _chat(client, EDIT, temperature=0, max_tokens=60, extra_body={"speculative.n_max": n, **predicted})
            for n in (0, 2, 64)
        }
        figures = {n: a.usage.model_extra["localspec"] for n, a in answers.items() if a.usage and a.usage.model_extra}
        assert figures[0]["drafted"] == 0 and 0 < figures[2]["drafted"] <= 2 * figures[2]["target_passes"]
        assert figures[64]["drafted"] > 2 * figures[64]["target_passes"]
        for answer in answers.values():
            _same(target, EDIT, answer.choices[0].message.content or "", text)
        bad = httpx.post(
            f"{fixed.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "speculative.n_max": -1},
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "speculative.n_max"
    finally:
        assert fixed.stop() == 0


def test_concurrent_clients_get_what_they_get_alone(server: Server, target: Model) -> None:
    """Four clients at once are served one after another, each as if alone.

    Greedy text may still part at a near tie of the target's logits: the drafts (and so the batch
    shapes) depend on what the server served before. Where texts differ, the tie is checked.
    """
    prompts = [f"Give one fact about the number {n}." for n in (3, 7, 12, 40)]
    alone = [_chat(server.client(), p, temperature=0, max_tokens=24).choices[0].message.content for p in prompts]
    together: dict[int, str | None] = {}

    def ask(i: int) -> None:
        together[i] = _chat(server.client(), prompts[i], temperature=0, max_tokens=24).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, prompt in enumerate(prompts):
        assert together[i] and alone[i]
        _same(target, prompt, together[i], alone[i])


def _wait_for(condition, what: str, seconds: float = 120) -> None:
    """Poll until condition() holds (bounded): the test waits for an event, not for a guessed time."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_client_that_disconnects_frees_the_server(server: Server) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
        for n, _ in enumerate(response.iter_lines()):
            if n >= 6:
                break  # leave mid-stream
    _wait_for(lambda: " 499 the client went away" in server.log_path.read_text(), "the 499 line")
    cut = int(server.log_path.read_text().split(" 499 the client went away after ")[-1].split()[0])
    assert cut < 100  # the generation stopped when its client left, far short of its 400 tokens
    _wait_for(lambda: not httpx.get(f"{server.url}/health").json()["busy"], "the worker to be free")
    assert _chat(server.client(), "Say hello.", temperature=0, max_tokens=8).choices[0].message.content


BAD = [
    ("not json", 400, None),
    ({"model": MODEL}, 400, "messages"),
    ({"model": MODEL, "messages": "hello"}, 400, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 50}, 400, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400, "top_p"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 21}, 400, "top_logprobs"),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
        400,
        "tools.0.function",
    ),
    (
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}},
        },
        400,
        "response_format",
    ),
    (
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "tool_choice",
    ),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0.5},
        400,
        "presence_penalty",
    ),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 3000}]}, 400, "messages"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    server: Server, body: object, status: int, param: str | None
) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(
        f"{server.url}/v1/chat/completions", content=content, headers={"Content-Type": "application/json"}, timeout=60
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    if param == "messages" and status == 400 and "word" in content:
        assert error["code"] == "context_length_exceeded"
    assert _chat(server.client(), "Say ok.", temperature=0, max_tokens=3).choices[0].message.content


def test_api_key_and_queue_limit(target_path: Path) -> None:
    s = Server("--api-key", "sesame", "--max-queue", "1", "--model-alias", "local")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert httpx.get(f"{s.url}/v1/models").status_code == 401
        assert httpx.get(f"{s.url}/docs").status_code == 401  # the API's docs follow the key too
        assert httpx.get(f"{s.url}/health").status_code == 200  # health stays open
        lower = httpx.get(f"{s.url}/v1/models", headers={"Authorization": "bearer sesame"})
        assert lower.status_code == 200  # the scheme in any case
        assert [m.id for m in s.client("sesame").models.list()] == ["local"]
        body = {
            "model": "local",
            "messages": [
                {"role": "user", "content": "Write the numbers from one to two hundred in words, one per line."}
            ],
            "max_tokens": 300,
            "temperature": 0,
            "stream": True,
        }
        headers = {"Authorization": "Bearer sesame"}
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=body, headers=headers, timeout=60) as first:
            lines = first.iter_lines()  # kept: a dropped line iterator closes the response
            next(lines)  # running
            waited: list[httpx.Response] = []
            waiter = threading.Thread(
                target=lambda: waited.append(
                    httpx.post(
                        f"{s.url}/v1/chat/completions",
                        headers=headers,
                        json={**body, "stream": False, "max_tokens": 2},
                        timeout=120,
                    )
                )
            )
            waiter.start()
            _wait_for(lambda: httpx.get(f"{s.url}/health").json()["waiting"] == 1, "the request to queue")
            third = httpx.post(f"{s.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
            assert third.status_code == 503 and third.headers["Retry-After"]
            assert third.json()["error"]["code"] == "queue_full"
        waiter.join(timeout=120)
        assert [r.status_code for r in waited] == [200]  # the queued request got its answer once its turn came
        assert waited[0].json()["usage"]["completion_tokens"] <= 2
    finally:
        assert s.stop() == 0
    log = s.log_path.read_text()
    assert " 401 " in log and " 503 " in log and "one to two hundred" not in log  # no prompts without --log-prompts
    assert "WARNING" not in log  # loopback: no warning


def test_serving_beyond_loopback_without_a_key_warns(target_path: Path) -> None:
    s = Server("--host", "0.0.0.0")
    try:
        assert "WARNING: serving on 0.0.0.0 without --api-key" in s.log_path.read_text()
    finally:
        assert s.stop() == 0


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_every_refusal_is_openai_shaped(server: Server) -> None:
    """Unknown paths, wrong methods, unreadable or non-JSON bodies, oversize bodies, limits on the context, the
    prediction and stop strings: each an OpenAI-shaped error with a fitting status, refused before queueing."""
    url, chat = server.url, f"{server.url}/v1/chat/completions"
    _error(httpx.get(f"{url}/v1/nothing"), 404)
    _error(httpx.get(chat), 405)
    assert httpx.get(f"{url}/v1/models/{MODEL}").json()["id"] == MODEL
    assert _error(httpx.get(f"{url}/v1/models/gpt-4o"), 404)["code"] == "model_not_found"
    headers = {"Content-Type": "application/json"}
    _error(httpx.post(chat, content=b'{"model": "\xff\xfe"}', headers=headers), 400)
    _error(httpx.post(chat, content=b"model=x", headers={"Content-Type": "application/x-www-form-urlencoded"}), 415)
    big = b'{"model": "' + b"x" * (17 * 2**20) + b'"}'
    assert _error(httpx.post(chat, content=big, headers=headers, timeout=60), 413)["code"] == "body_too_large"
    hi = [{"role": "user", "content": "hi"}]
    too_many = {"model": MODEL, "messages": hi, "max_tokens": 5000}
    assert _error(httpx.post(chat, json=too_many), 400)["param"] == "max_tokens"
    long_prediction = {"model": MODEL, "messages": hi, "prediction": {"type": "content", "content": "word " * 3000}}
    assert _error(httpx.post(chat, json=long_prediction), 400)["param"] == "prediction"
    assert _error(httpx.post(chat, json={"model": MODEL, "messages": hi, "stop": "x" * 300}), 400)["param"] == "stop"
    assert _chat(server.client(), "Say ok.", temperature=0, max_tokens=3).choices[0].message.content


def test_no_way_in_from_a_web_page(server: Server) -> None:
    """DNS rebinding sends the page's name as Host; a cross-site page sends its Origin: both get a 403."""
    models = f"{server.url}/v1/models"
    assert _error(httpx.get(models, headers={"Host": "evil.example"}), 403)["code"] == "bad_host"
    assert _error(httpx.get(models, headers={"Origin": "http://evil.example"}), 403)["code"] == "bad_origin"
    assert httpx.get(models, headers={"Host": f"localhost:{server.port}"}).status_code == 200
    assert httpx.get(models, headers={"Origin": "http://localhost:3000"}).status_code == 200  # a local web UI


def _post_and_hold(server: Server, body: dict[str, object]) -> socket.socket:
    """A non-streamed request sent on a raw socket that the test closes when it chooses (a client leaving)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def test_a_client_that_leaves_before_its_answer_frees_the_server(server: Server) -> None:
    """A non-streamed request whose client leaves stops at the next round; a queued one leaves the queue at
    once, while the first still runs, and never starts."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
        "max_tokens": 1000,
        "temperature": 0,
    }

    def health() -> dict[str, object]:
        return dict(httpx.get(f"{server.url}/health").json())

    def gone() -> list[str]:
        return [line for line in server.log_path.read_text().splitlines() if " 499 " in line]

    before = len(gone())
    running = _post_and_hold(server, body)
    _wait_for(lambda: health()["busy"], "the first request to run")
    queued = _post_and_hold(server, body)
    _wait_for(lambda: health()["waiting"] == 1, "the second request to queue")
    queued.close()
    _wait_for(lambda: len(gone()) == before + 1, "the queued request's 499 line")
    assert gone()[-1].endswith("after 0 tokens"), gone()  # it never started
    assert health() | {"model": None} == {"status": "ok", "model": None, "waiting": 0, "busy": True}
    running.close()
    _wait_for(lambda: len(gone()) == before + 2, "the running request's 499 line")
    assert int(gone()[-1].split(" after ")[1].split()[0]) < 400, gone()  # stopped far short of its 1000 tokens
    _wait_for(lambda: not health()["busy"], "the worker to be free")


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a blocking read: the server's event)."""
    sock.settimeout(120)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_silent_slow_and_crowding_clients_stall_nothing(target_path: Path) -> None:
    """Half a header, a body that never ends, sixty idle sockets and a stream nobody reads: each is dropped after
    --client-timeout, and the others are served meanwhile; a full queue refuses before the body is read."""
    s = Server("--client-timeout", "2", "--max-queue", "1", "--max-body", "4096")
    try:
        half = raw(s.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127")
        idle = [raw(s.port, b"") for _ in range(60)]
        short = raw(s.port, head(s.port, 1000) + b'{"model":')
        assert httpx.get(f"{s.url}/health", timeout=10).status_code == 200  # served beside them
        assert _answer(half) == b"" and all(_answer(sock) == b"" for sock in idle)  # closed, unanswered
        late = _answer(short)
        assert late.startswith(b"HTTP/1.1 408") and b"body_timeout" in late, late
        chunked = httpx.post(
            f"{s.url}/v1/chat/completions",
            content=iter([b'{"model": "', b"x" * 3000, b"x" * 3000, b'"}']),  # no length: chunked
            headers={"Content-Type": "application/json"},
        )
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "body_too_large"

        deaf = raw(s.port, request(s.port, UNREAD), rcvbuf=4096)  # a long stream with logprobs, never read
        _wait_for(lambda: httpx.get(f"{s.url}/health").json()["busy"], "the unread stream to run")
        queued = raw(s.port, request(s.port, UNREAD))
        _wait_for(lambda: httpx.get(f"{s.url}/health").json()["waiting"] == 1, "a request to queue")
        crowd = raw(s.port, head(s.port, 4000))  # headers only: refused before its body is sent
        refused = _answer(crowd)
        assert refused.startswith(b"HTTP/1.1 503") and b"queue_full" in refused, refused
        queued.close()
        dropped = ("kept its answer waiting 2 s", "499 the client went away")
        _wait_for(lambda: any(d in s.log_path.read_text() for d in dropped), "the unread stream to be dropped")
        reply = _chat(s.client(), "Say ok.", temperature=0, max_tokens=3)  # the worker serves the next one
        assert reply.choices[0].message.content
        deaf.close()
        crowd.close()
    finally:
        assert s.stop() == 0
    assert "Traceback" not in s.log_path.read_text()


# ---- agents and structured output -------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "languages": {"type": "array", "items": {"enum": ["python", "rust", "go", "c"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}


def test_a_two_step_tool_loop(server: Server) -> None:
    """The call (required: the grammar keeps it valid), the tool's result, the final answer."""
    client = server.client()
    messages: list[dict[str, object]] = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert "paris" in args["city"].lower()
    assert first.usage.model_extra["localspec"]["drafted_by"].get("forced", 0) > 0  # the call's markup was forced
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18, "sky": "cloudy"})},
    ]
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=60
    )
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert "18" in final.choices[0].message.content


def test_a_streamed_tool_call_comes_in_openai_deltas(server: Server) -> None:
    stream = server.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is it raining in Oslo?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=80,
        stream=True,
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert calls[0].id and calls[0].function.name == "get_weather" and calls[0].index == 0
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert "oslo" in json.loads(arguments)["city"].lower()
    assert not "".join(d.content or "" for d in deltas)  # the call's markup never shows as content
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_json_schema_answers_validate(server: Server, temperature: float) -> None:
    reply = _chat(
        server.client(),
        "Describe a programmer as JSON.",
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        temperature=temperature,
        seed=7,
        max_tokens=120,
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
    assert reply.usage.model_extra["localspec"]["accepted_by"].get("forced", 0) > 0  # the key names were drafted
    obj = _chat(server.client(), "Give me a JSON object with a greeting.", response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


@pytest.fixture(scope="module")
def alone(target_path: Path) -> LocalSpec:
    """The target alone, in this process: the reference a server's answers are held to."""
    return LocalSpec.load(target=str(target_path), no_draft=True, ctx=int(CTX))


def test_json_schema_with_drafting_equals_the_target_alone(server: Server, target: Model, alone: LocalSpec) -> None:
    """Forced tokens are drafted, verified and change nothing: the same JSON as the target alone writes
    under the same grammar, token by token (bar a near tie)."""
    prompt = "List two programmers as JSON: a name, an age and the languages each uses."
    schema = {"type": "array", "items": PERSON, "minItems": 2, "maxItems": 2}
    fmt = {"type": "json_schema", "json_schema": {"name": "people", "schema": schema}}
    reply = _chat(server.client(), prompt, response_format=fmt, temperature=0, max_tokens=200)
    assert reply.usage.model_extra["localspec"]["accepted_by"].get("forced", 0) > 0
    want = alone.generate(prompt, response_format=fmt, temperature=0, max_tokens=200)
    want.result()
    assert want.stats.drafted == 0
    jsonschema.validate(json.loads(want.text), schema)
    grammar = json_schema_grammar(schema)
    assert_same_constrained(target, want.prompt_tokens, reply.choices[0].message.content, want.tokens, grammar)


def test_logprobs_match_the_target_alone(server: Server, target: Model) -> None:
    """Each token's log-probability is the target's own log-softmax at that position, whatever was drafted:
    recomputed here one token at a time on the target alone (batched and one-token decoding differ by
    ~0.1 logit, so each may differ by up to 0.25 nats; their sum is checked against the same bound per token)."""
    reply = _chat(server.client(), EDIT, temperature=0, max_tokens=40, logprobs=True, top_logprobs=5)
    assert reply.usage.model_extra["localspec"]["drafted"] > 0
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    prompt = chat_tokens(target, [{"role": "user", "content": EDIT}])
    tokens = target.tokenize("".join(e.token for e in entries))
    ctx, total, want_total = list(prompt), 0.0, 0.0
    for e, tok in zip(entries, tokens, strict=False):
        logits = target.sync(ctx, 1)[0].astype(np.float64)
        want = float(logits[tok] - logits.max() - np.log(np.exp(logits - logits.max()).sum()))
        assert abs(e.logprob - want) < 0.25, (e.token, e.logprob, want)
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert len(e.top_logprobs) == 5 and e.logprob <= e.top_logprobs[0].logprob + 1e-9
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
        total, want_total = total + e.logprob, want_total + want
        ctx.append(tok)
    assert abs(total - want_total) < 0.25 * len(entries) ** 0.5 + 0.1


def test_fill_in_the_middle(server: Server, target: Model, alone: LocalSpec) -> None:
    """`suffix` on completions: the text between, asked for with the target's FIM tokens; the same text as
    the target alone writes."""
    prefix = CODE.replace("    return result\n", "    return result\n\n\ndef average(items):\n")
    suffix = "\n\nprint(average([]))\n"
    reply = server.client().completions.create(
        model=MODEL, prompt=prefix, suffix=suffix, temperature=0, max_tokens=60, logprobs=2
    )
    text = reply.choices[0].text
    assert "return" in text and "<|fim" not in text
    assert reply.choices[0].logprobs.tokens and len(reply.choices[0].logprobs.top_logprobs[0]) <= 2
    want = alone.generate(prefix, suffix=suffix, temperature=0, max_tokens=60)
    want.result()
    pre, suf, mid = target.fim_tokens()
    assert want.prompt_tokens[0] == pre and want.prompt_tokens[-1] == mid and suf in want.prompt_tokens
    assert_same_tokens(target, want.prompt_tokens, target.tokenize(text), want.tokens)


def test_suffix_without_fim_tokens_is_a_400(gemma_path: Path) -> None:
    s = Server("--target", str(gemma_path), "--no-draft", "--model-alias", "gemma")
    try:
        with pytest.raises(openai.BadRequestError) as e:
            s.client().completions.create(model="gemma", prompt="def f():", suffix="\n", max_tokens=5)
        assert e.value.body["param"] == "suffix" and "fill-in-the-middle" in e.value.body["message"]
        with pytest.raises(openai.BadRequestError) as e:  # this GGUF has no chat template at all
            s.client().chat.completions.create(
                model="gemma", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], max_tokens=5
            )
        assert "chat template" in e.value.body["message"]
    finally:
        assert s.stop() == 0


def test_responses_answer_as_chat_completions_do(server: Server, target: Model) -> None:
    """The Responses API through the openai client: the same text as chat completions, whole and streamed,
    with the drafting (and its figures) of the same door."""
    client = server.client()
    want = _chat(client, EDIT, temperature=0, max_tokens=60).choices[0].message.content or ""
    whole = client.responses.create(model=MODEL, input=EDIT, temperature=0, max_output_tokens=60)
    _same(target, EDIT, whole.output_text, want)
    assert whole.usage is not None and whole.usage.model_extra["localspec"]["drafted"] > 0
    events = list(client.responses.create(model=MODEL, input=EDIT, temperature=0, max_output_tokens=60, stream=True))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert streamed == events[-1].response.output_text
    _same(target, EDIT, streamed, want)


def test_a_prompt_asked_again_after_another_is_restored_and_counted(server: Server) -> None:
    """Another conversation in between: the first's prompt comes back from the prompt cache (the same answer) and
    usage counts it as cached, in chat completions and the Responses API."""
    client = server.client()
    rules = "You answer in one short sentence. " + " ".join(f"Rule {i}: be precise and brief." for i in range(40))
    question = "Name a prime number greater than ten."
    ask = [{"role": "system", "content": rules}, {"role": "user", "content": question}]
    first = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=12, temperature=0)
    _chat(client, HAIKU, max_tokens=12, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=12, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content
    usage = again.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens > 300
    answers = []
    for _ in range(2):
        answers.append(client.responses.create(model=MODEL, instructions=rules, input=question, max_output_tokens=16))
        _chat(client, HAIKU, max_tokens=12, temperature=0)
    usage_r = answers[1].usage
    assert usage_r is not None and usage_r.input_tokens_details.cached_tokens >= 0.9 * usage_r.input_tokens


def test_a_responses_tool_call_and_its_result(server: Server) -> None:
    """A function tool is called with well-formed arguments; the next request, carrying the call and its output,
    is answered with text that uses the output (tool_choice none: this small model would call the tool again)."""
    client = server.client()
    tool = {"type": "function", **WEATHER["function"]}
    question = "What is the weather in Oslo? Use the tool."
    first = client.responses.create(model=MODEL, input=question, tools=[tool, {"type": "web_search"}], temperature=0)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and "oslo" in json.loads(call.arguments)["city"].lower()
    history = [
        {"role": "user", "content": question},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Snow, -4 C"},
    ]
    second = client.responses.create(
        model=MODEL, input=history, tools=[tool], tool_choice="none", temperature=0, max_output_tokens=60
    )
    assert second.status == "completed" and ("-4" in second.output_text or "snow" in second.output_text.lower())


def test_responses_json_schema_drafts_the_forced_tokens(server: Server) -> None:
    """text.format json_schema: the answer validates, and the grammar's forced tokens were drafted."""
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON}
    reply = server.client().responses.create(
        model=MODEL, input="Describe a programmer as JSON.", text={"format": fmt}, temperature=0, max_output_tokens=120
    )
    jsonschema.validate(json.loads(reply.output_text), PERSON)
    assert reply.usage is not None and reply.usage.model_extra["localspec"]["accepted_by"].get("forced", 0) > 0


def test_the_edit_request_continue_sends(server: Server, target: Model) -> None:
    """Continue's edit path: a streamed chat completion with usage asked for, the file being edited as the
    prediction. The answer streams as it would without the prediction, drafted from the file."""
    client = server.client()
    messages = [
        {"role": "system", "content": "You rewrite code as asked. Reply with the whole rewritten file only."},
        {"role": "user", "content": EDIT},
    ]
    asked = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 80}
    want = client.chat.completions.create(**asked).choices[0].message.content or ""
    chunks = list(
        client.chat.completions.create(
            **asked,
            stream=True,
            stream_options={"include_usage": True},
            prediction={"type": "content", "content": CODE},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details.accepted_prediction_tokens > 0
    if text != want:  # the same text, bar a near tie of the target's scores
        prompt = chat_tokens(target, messages)
        assert_same_tokens(target, prompt, target.tokenize(text), target.tokenize(want), None, 0)


def _anthropic(server: Server) -> Any:
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def test_anthropic_messages_answer_as_chat_completions_do(server: Server, target: Model) -> None:
    """Anthropic's Messages API through the official anthropic SDK: the same text as chat completions, whole and
    streamed, whatever model name it asks for; a prompt asked again is read from the cache and usage says so.
    (The SDK has no sampling arguments any more: temperature goes as an extra field, as Claude Code's need none.)"""
    client = _anthropic(server)
    want = _chat(server.client(), EDIT, temperature=0, max_tokens=60).choices[0].message.content or ""
    ask = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 60,
        "extra_body": {"temperature": 0},
        "messages": [{"role": "user", "content": EDIT}],
    }
    whole = client.messages.create(**ask)
    assert whole.model == MODEL and whole.stop_reason in ("end_turn", "max_tokens")
    _same(target, EDIT, whole.content[0].text, want)
    assert 0 < whole.usage.input_tokens <= 32  # a prefill decodes its last tiles again (Model.sync): the rest was read
    assert whole.usage.cache_read_input_tokens >= 48
    with client.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    _same(target, EDIT, streamed, want)
    assert final.content[0].text == streamed and final.usage.output_tokens == whole.usage.output_tokens


def test_an_anthropic_tool_round(server: Server) -> None:
    """A forced tool (tool_choice tool: the grammar keeps its input valid) comes back as a tool_use block; its
    tool_result goes back in the next request, and the answer uses it."""
    client = _anthropic(server)
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"]}
    tool["input_schema"] = WEATHER["function"]["parameters"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    first = client.messages.create(
        model="m",
        max_tokens=80,
        extra_body={"temperature": 0},
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=messages,
    )
    use = first.content[-1]
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.name == "get_weather"
    assert "paris" in use.input["city"].lower()
    result = {
        "type": "tool_result",
        "tool_use_id": use.id,
        "content": json.dumps({"temperature_c": 18, "sky": "cloudy"}),
    }
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [result]},
    ]
    final = client.messages.create(
        model="m",
        max_tokens=60,
        extra_body={"temperature": 0},
        tools=[tool],
        tool_choice={"type": "none"},
        messages=messages,
    )
    assert final.stop_reason == "end_turn" and "18" in final.content[0].text


def test_a_stored_conversation_answers_as_the_whole_history_does(server: Server, target: Model) -> None:
    """Three turns through `previous_response_id`, each sending only its new input, give the text the same
    conversation sent whole each turn gives (greedy; or they part at a near tie, the two prompts' last tiles
    decoded in other batches)."""
    client = server.client()
    turns = ["Name a fruit.", "Name another one.", "Which of the two is sweeter?"]
    previous, history, texts = None, [], []
    for turn in turns:
        kept = client.responses.create(
            model=MODEL, input=turn, previous_response_id=previous, temperature=0, max_output_tokens=24
        )
        history += [{"role": "user", "content": turn}]
        whole = client.responses.create(model=MODEL, input=history, store=False, temperature=0, max_output_tokens=24)
        _same(target, history, kept.output_text, whole.output_text)
        history += [{"role": "assistant", "content": kept.output_text}]
        previous = kept.id
        texts.append(kept.output_text)
    assert len(set(texts)) == 3
