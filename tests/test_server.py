"""`localspec serve` as clients use it: the real server on a free local port, the official openai client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import assert_same_tokens, run_cli

from localspec.core.sampling import SamplerSettings
from localspec.llama.model import Model
from localspec.llama.template import chat_tokens

CTX = "2048"
MODEL = "qwen2.5-coder-1.5b-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A `localspec serve` subprocess, its base URL and its stderr (the access log)."""

    def __init__(self, *args: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ["LOCALSPEC_DATA_DIR"]).parent / f"serve-{self.port}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "serve", "--port", str(self.port), "--ctx", CTX, *args],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise AssertionError("the server did not come up")

    def client(self, key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=300)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self.log.close()
        return code


@pytest.fixture(scope="module")
def server(target_path: Path, draft_path: Path) -> Iterator[Server]:
    s = Server()
    yield s
    assert s.stop() == 0  # SIGTERM shuts it down cleanly
    assert "Traceback" not in s.log_path.read_text()


def _same(
    target: Model,
    prompt: str,
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
    tokens = (
        target.tokenize(prompt, add_bos=True) if raw else chat_tokens(target, [{"role": "user", "content": prompt}])
    )
    assert_same_tokens(target, tokens, target.tokenize(got), target.tokenize(want), sampler, seed)


def _chat(client: openai.OpenAI, content: str, **kw: object) -> openai.types.chat.ChatCompletion:
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


def test_concurrent_clients_get_what_they_get_alone(server: Server, target: Model) -> None:
    """Four clients at once are served one after another, each as if alone.

    Greedy text may still part at a near tie of the target's logits: the drafts (and so the batch
    shapes) depend on what the server served before. Where texts differ, the tie is checked.
    """
    prompts = [f"Give one fact about the number {n}." for n in (3, 7, 12, 40)]
    alone = [_chat(server.client(), p, temperature=0, max_tokens=24).choices[0].message.content for p in prompts]
    together: dict[int, str] = {}

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
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400, "logprobs"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400, "tools"),
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
            waiter = threading.Thread(
                target=lambda: httpx.post(
                    f"{s.url}/v1/chat/completions",
                    headers=headers,
                    json={**body, "stream": False, "max_tokens": 2},
                    timeout=120,
                )
            )
            waiter.start()
            _wait_for(lambda: httpx.get(f"{s.url}/health").json()["waiting"] == 1, "the request to queue")
            third = httpx.post(f"{s.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
            assert third.status_code == 503 and third.headers["Retry-After"]
            assert third.json()["error"]["code"] == "queue_full"
        waiter.join(timeout=120)
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


def test_a_client_that_leaves_before_its_answer_frees_the_server(server: Server) -> None:
    """Non-streamed requests whose clients time out stop at the next round, or never start when still queued."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
        "max_tokens": 1000,
        "temperature": 0,
    }
    before = server.log_path.read_text().count(" 499 ")
    errors: list[Exception] = []

    def impatient() -> None:
        try:
            httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=4)
        except httpx.TimeoutException as e:
            errors.append(e)

    clients = [threading.Thread(target=impatient) for _ in range(2)]  # the second waits in the queue, then leaves
    for c in clients:
        c.start()
    for c in clients:
        c.join(timeout=60)
    assert len(errors) == 2, errors
    _wait_for(lambda: server.log_path.read_text().count(" 499 ") >= before + 2, "both 499 lines")
    gone = [line for line in server.log_path.read_text().splitlines() if " 499 " in line][before:]
    cuts = [int(line.split(" after ")[1].split()[0]) for line in gone]
    assert max(cuts) < 400 and min(cuts) == 0, gone  # one stopped mid-answer, the queued one never started
    _wait_for(lambda: not httpx.get(f"{server.url}/health").json()["busy"], "the worker to be free")
