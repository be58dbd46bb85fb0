"""Nothing a client does stalls the server or holds a connection for ever: a real uvicorn on a free local port
with the server's own settings, raw sockets and httpx as clients, and a model-free stand-in answering."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from stall_check import head, raw, request
from support.standin import Served, StandIn, serving, until

KB = "x" * 1000  # a piece of a kilobyte: a client that does not read fills its buffers in a few dozen tokens


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    spec, options = request.param
    with serving(spec, **options) as s:
        yield s


def _streamed(port: int, tokens: int = 100_000) -> bytes:
    body = {"model": "standin", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": tokens, "stream": True}
    return request(port, body)


def _ok(url: str) -> int:
    body = {"model": "standin", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code


def _reply(sock: socket.socket, seconds: float = 30) -> bytes:
    sock.settimeout(seconds)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


@pytest.mark.parametrize("served", [(StandIn(KB), {"timeout": 1.0, "max_connections": 5})], indirect=True)
def test_clients_that_never_read_are_closed_and_stop_counting(served: Served) -> None:
    """Four streamed clients that never read and never close, against --max-connections 5: each is dropped
    after --client-timeout (its generation stopped, its connection aborted), so five fresh clients at once are
    then all answered."""
    deaf = [raw(served.port, _streamed(served.port), rcvbuf=4096) for _ in range(4)]
    stopped = lambda: sum("499" in line for line in served.log)  # noqa: E731
    until(lambda: served.connections == 0 and stopped() == 4, "the four connections aborted, their generations stopped")
    results: list[int] = []
    fresh = [threading.Thread(target=lambda: results.append(_ok(served.url))) for _ in range(5)]
    for t in fresh:
        t.start()
    for t in fresh:
        t.join(60)
    assert results == [200] * 5
    for sock in deaf:
        sock.close()


@pytest.mark.parametrize("served", [(StandIn(), {"timeout": 1.0, "max_queue": 1})], indirect=True)
def test_a_trickled_body_gives_its_place_back_at_its_deadline(served: Served) -> None:
    """A body trickled a byte at a time holds its place in the queue only until the whole body's deadline
    (--client-timeout), not for as long as the bytes keep coming: then it gets a 408 and the place is free."""
    trickler = raw(served.port, head(served.port, 1000))
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            try:
                trickler.sendall(b" ")
            except OSError:
                return
            stop.wait(0.2)

    feeder = threading.Thread(target=trickle)
    feeder.start()
    try:
        until(lambda: httpx.get(f"{served.url}/health").json()["waiting"] == 1, "the trickled request to be admitted")
        assert _ok(served.url) == 503  # its place is taken
        late = _reply(trickler)
        assert late.startswith(b"HTTP/1.1 408") and b"body_timeout" in late, late
        assert _ok(served.url) == 200
    finally:
        stop.set()
        feeder.join()
        trickler.close()


@pytest.mark.parametrize("served", [(StandIn(KB, pace=0.002), {"timeout": 1.0})], indirect=True)
def test_a_slow_reader_holds_the_worker_at_most_the_timeout_beyond_its_answer(served: Served) -> None:
    """A client reading 4 KiB every 0.2 s of a 2 MB answer (2,000 tokens of 2 ms): it is dropped once it has kept
    its answer waiting --client-timeout in all (or left the connection's buffers full that long), and a request
    queued behind it is answered while it is still reading."""
    slow = raw(served.port, _streamed(served.port, 2000), rcvbuf=4096)
    until(lambda: httpx.get(f"{served.url}/health").json()["busy"], "the slow stream to run")
    queued: list[int] = []
    behind = threading.Thread(target=lambda: queued.append(_ok(served.url)))
    behind.start()
    read = 0
    slow.settimeout(5)
    while behind.is_alive():
        try:
            chunk = slow.recv(4096)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        read += len(chunk)
        time.sleep(0.2)
    behind.join(60)
    assert queued == [200] and read < 2_000_000
    assert any("kept its answer waiting 1 s in all" in line or "499" in line for line in served.log), served.log
    slow.close()


@pytest.mark.parametrize("served", [(StandIn(), {"max_connections": 3})], indirect=True)
def test_sockets_that_send_nothing_never_lock_out_a_client(served: Served) -> None:
    """Idle connections filling --max-connections: a request closes the longest idle of them and is answered."""
    idle = [raw(served.port, b"") for _ in range(3)]
    until(lambda: served.connections == 3, "three idle connections")
    assert [_ok(served.url) for _ in range(3)] == [200] * 3
    assert served.connections <= 3
    for sock in idle:
        sock.close()


@pytest.mark.parametrize("served", [(StandIn(), {"max_connections": 1})], indirect=True)
def test_nothing_gives_a_500_and_every_refusal_is_openai_shaped(served: Served) -> None:
    """A malformed Origin, a lone surrogate in a field, a connection beyond --max-connections: 4xx or 503, in
    OpenAI's error shape."""
    origin = httpx.get(f"{served.url}/v1/models", headers={"Origin": "http://[evil"})
    assert origin.status_code == 403 and origin.json()["error"]["code"] == "bad_origin"
    body = '{"model": "\\ud800", "messages": [{"role": "user", "content": "\\udfff"}]}'
    surrogate = httpx.post(
        f"{served.url}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
    )
    assert surrogate.status_code == 400 and "not Unicode" in surrogate.json()["error"]["message"], surrogate.text
    held = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nContent-Length: 99\r\n\r\n{{"
    busy = raw(served.port, held.encode())
    until(lambda: served.connections == 1, "the connection whose body is on its way")
    crowded = httpx.get(f"{served.url}/v1/models")
    assert crowded.status_code == 503 and crowded.json()["error"]["code"] == "too_many_connections"
    assert crowded.headers["retry-after"] and crowded.headers["connection"] == "close"
    busy.close()
    json.dumps(served.log)


MESSAGE = b'{"role":"user","content":"a"}'


@pytest.mark.parametrize("served", [(StandIn(), {})], indirect=True)
@pytest.mark.parametrize(
    ("path", "field", "tiny", "end"),
    [
        ("/v1/chat/completions", "messages", MESSAGE + b",", MESSAGE + b"]"),
        (
            "/v1/responses",
            "input",
            b'{"type":"message","role":"user","content":"a"},{"type":"function_call_output","call_id":"c","output":"o"},',
            MESSAGE + b"]",
        ),
        ("/v1/responses", "input", b'{"type":"reasoning","summary":[]},', MESSAGE + b"]"),  # items left out
        ("/v1/chat/completions", "messages", b'{"type":"text","text":"a"},', b'{"type":"text","text":"a"}]}]'),
        ("/v1/completions", "prompt", b'"a",', b'"a"]'),
    ],
    ids=["chat", "responses", "reasoning", "text-parts", "prompt-list"],
)
def test_too_many_items_are_refused_before_the_body_is_parsed(
    served: Served, path: str, field: str, tiny: bytes, end: bytes
) -> None:
    """A 15 MiB body of half a million tiny items of any kind (messages, input items, items the server leaves out,
    one message's text parts, a prompt list): refused as it arrives (400 naming the field), never parsed into
    objects: the process's allocations stay within a few copies of the body."""
    import tracemalloc

    start = (
        b'{"model":"standin","'
        + field.encode()
        + b'":['
        + (b'{"role":"user","content":[' if b'"text"' in tiny else b"")
    )
    body = start + tiny * (15 * 2**20 // len(tiny)) + end + b"}"
    tracemalloc.start()
    try:
        refused = httpx.post(
            f"{served.url}{path}", content=body, headers={"Content-Type": "application/json"}, timeout=60
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.status_code == 400 and refused.json()["error"]["param"] == field, refused.text
    assert refused.json()["error"]["code"] == "too_many", refused.text
    assert peak < 4 * len(body), f"{peak / 2**20:.0f} MiB at the peak for a {len(body) / 2**20:.0f} MiB body"


@pytest.mark.parametrize("served", [(StandIn(n_ctx=8192), {})], indirect=True)
def test_the_models_list_says_what_a_model_supports(served: Served) -> None:
    """Continue sends `prediction` only to a model whose metadata lists it; Aider and OpenRouter-style clients read
    the context length."""
    (entry,) = httpx.get(f"{served.url}/v1/models").json()["data"]
    assert entry["context_length"] == 8192 and entry == httpx.get(f"{served.url}/v1/models/standin").json()
    assert {"prediction", "tools", "response_format", "logprobs", "suffix", "speculative.n_max"} <= set(
        entry["supported_parameters"]
    )


@pytest.mark.parametrize("served", [(StandIn(), {"timeout": 30.0, "max_queue": 1})], indirect=True)
def test_a_responses_request_takes_its_place_before_its_body(served: Served) -> None:
    """A Responses request holds its place in the queue from its headers on, as chat's does: with one place, a
    second is refused (503) while the first's body has not arrived."""
    waiting = raw(served.port, head(served.port, 1000).replace(b"/v1/chat/completions", b"/v1/responses"))
    try:
        until(lambda: httpx.get(f"{served.url}/health").json()["waiting"] == 1, "the Responses request's place")
        second = {"model": "standin", "input": "hi", "max_output_tokens": 2}
        assert httpx.post(f"{served.url}/v1/responses", json=second, timeout=30).status_code == 503
    finally:
        waiting.close()


@pytest.mark.parametrize("served", [(StandIn(), {})], indirect=True)
def test_namespaces_count_toward_the_tools_limit_before_any_schema_compiles(served: Served) -> None:
    """16 namespaces of 32 functions each (512 schemas, twice the limit) are a 400 naming tools before any compiles.
    (A body of thousands is refused sooner, as it arrives, by its count of JSON values.)"""
    fn = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}
    tools = [
        {"type": "namespace", "name": f"n{i}", "tools": [{**fn, "name": f"f{j}"} for j in range(32)]} for i in range(16)
    ]
    reply = httpx.post(
        f"{served.url}/v1/responses", json={"model": "standin", "input": "hi", "tools": tools}, timeout=60
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools", reply.text[:300]
    assert "256 functions in all" in reply.json()["error"]["message"]


@pytest.mark.parametrize("served", [(StandIn(KB, pace=0.002), {"timeout": 1.0})], indirect=True)
def test_a_stalled_answer_ends_with_an_error_not_a_clean_end(served: Served) -> None:
    """A reader that keeps reading, but slower than the answer comes (16 KiB every 50 ms of 500 KB/s), until the
    answer has waited --client-timeout in all: its stream ends with an error event (OpenAI's shape, code stalled)
    and [DONE], never looking like a whole answer; the log calls it a stall, not a client that went away."""
    slow = raw(served.port, _streamed(served.port, 2000), rcvbuf=16384)
    got = b""
    slow.settimeout(5)
    while not any("kept its answer waiting" in line for line in served.log) and (chunk := slow.recv(16384)):
        got += chunk
        time.sleep(0.05)
    got += _reply(slow)  # the rest, read at once
    slow.close()
    tail = got[-2000:].replace(b" ", b"")
    error, done = tail.find(b'"code":"stalled"'), tail.find(b"data:[DONE]")  # (in chunked framing)
    assert 0 <= error < done and done > len(tail) - 100, (tail[-300:], served.log)
    assert not any("499" in line for line in served.log), served.log
