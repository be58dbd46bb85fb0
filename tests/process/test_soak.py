"""A bounded soak of `localspec serve`: concurrent clients, streamed and whole answers, clients that leave.

Eight client threads send LOCALSPEC_SOAK_REQUESTS requests in all (40 in the default run; 200 for the long
version: `LOCALSPEC_SOAK_REQUESTS=200 python -m pytest tests/process/test_soak.py`). About one in five leaves at a
random moment (mid-stream, or by timing out on a whole answer) after asking for a long answer. Every answer
that completes equals the same request's answer alone (greedy; a near tie of the target's logits is checked
where they part); a generation whose client left stops within a few rounds, so nobody waits behind it; the
server's RSS stays within 50 MB; /health answers throughout.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.server import MODEL, Server
from test_server import _same, _wait_for

from localspec.llama.model import Model

REQUESTS = int(os.environ.get("LOCALSPEC_SOAK_REQUESTS", "40"))
CLIENTS = 8
PROMPTS = [f"Name one use of the number {n}, in one short sentence." for n in (2, 5, 9, 17, 64)]
ANSWER = 10  # tokens of a completed answer
# What a client that leaves asks for: an answer longer than its 300 tokens, so only its leaving stops it
LONG = "Write the whole numbers from 1 to 400, separated by spaces."


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def soaked(target_path: Path) -> Iterator[Server]:
    s = Server("--max-queue", "32")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.log_path.read_text()


def _ask(url: str, prompt: str, stream: bool, max_tokens: int, timeout: float) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if not stream:
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout).json()["choices"][0]["message"][
            "content"
        ]
    text = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                text += [d["delta"].get("content") or "" for d in delta]
    return "".join(text)


def _leave(url: str, stream: bool, after: float) -> None:
    """Ask for a long answer and go away after about `after` seconds: mid-stream, or on timing out."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 300, "stream": stream}
    if stream:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
            for n, _ in enumerate(response.iter_lines()):
                if n >= int(after * 5):
                    break
    else:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=after)


def test_soak(soaked: Server, target: Model) -> None:
    url = soaked.url
    alone = {p: _ask(url, p, False, ANSWER, 120) for p in PROMPTS}
    rss0 = _rss_mb(soaked.proc.pid)
    rng = random.Random(7)
    plan = [
        (rng.choice(PROMPTS), rng.random() < 0.5, rng.random() < 0.2, rng.uniform(0.3, 2.0)) for _ in range(REQUESTS)
    ]
    done: list[tuple[str, str]] = []
    leaving = sum(leaves for _, _, leaves, _ in plan)  # from the plan: no counter shared by the threads
    failures: list[str] = []
    health: list[int] = []
    stop = threading.Event()

    def watch_health() -> None:
        while not stop.wait(0.5):
            try:
                health.append(httpx.get(f"{url}/health", timeout=5).status_code)
            except httpx.HTTPError as e:
                failures.append(f"/health: {e!r}")

    def client(jobs: list[tuple[str, bool, bool, float]]) -> None:
        for prompt, stream, leaves, after in jobs:
            try:
                if leaves:
                    _leave(url, stream, after)
                else:
                    done.append((prompt, _ask(url, prompt, stream, ANSWER, 300)))
            except Exception as e:
                failures.append(repr(e))

    watcher = threading.Thread(target=watch_health)
    watcher.start()
    threads = [threading.Thread(target=client, args=(plan[i::CLIENTS],)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=1200)
    _wait_for(lambda: not httpx.get(f"{url}/health").json()["busy"], "the worker to be free")
    stop.set()
    watcher.join()
    assert not failures, failures[:5]
    assert health and set(health) == {200}
    assert len(done) == REQUESTS - leaving and leaving > 0
    for prompt, text in done:
        _same(target, prompt, text, alone[prompt])
    log = soaked.log_path.read_text().splitlines()
    cuts = [int(line.split(" after ")[1].split()[0]) for line in log if " 499 " in line]
    # a generation whose client left stopped within rounds of its leaving (after 0.3-2 s), not at its 300 tokens
    assert cuts and max(cuts) < 100
    assert _rss_mb(soaked.proc.pid) - rss0 < 50
