"""Slow, silent and vanished clients against a real `localspec serve`: does anything stall?

    python scripts/stall_check.py --client-timeout 5

Starts a server on a free local port and measures, in order:
1. a normal request alone (its whole time);
2. the same request behind a stream nobody reads, 40 half-sent headers and 12 queued clients that leave:
   how long `waiting` takes to fall back to 0 once they left, when the unread stream was dropped, and the
   normal request's time (its wait for the answer in progress included);
3. `/health` with 300 idle sockets open.
Prints one table (and --json writes the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

UNREAD = {  # a long stream with 20 alternatives a token: it fills socket buffers fast
    "model": "qwen2.5-coder-1.5b-instruct",
    "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
    "max_tokens": 2000,
    "temperature": 0,
    "stream": True,
    "logprobs": True,
    "top_logprobs": 20,
}
NORMAL = {
    "model": "qwen2.5-coder-1.5b-instruct",
    "messages": [{"role": "user", "content": "Say hello in five words."}],
    "max_tokens": 16,
    "temperature": 0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(
    *args: str, env: dict[str, str] | None = None, log: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`localspec serve ARGS` on a free port, once its /health answers: the process and its base URL (its stderr
    appended to `log`, else dropped)."""
    port = free_port()
    cmd = [sys.executable, "-m", "localspec", "serve", "--port", str(port), *args]
    err = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the server's for its life
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    url = f"http://127.0.0.1:{port}"
    until(lambda: server.poll() is not None or _up(url), 600)
    if server.poll() is not None:
        raise SystemExit(f"localspec serve {' '.join(args)} ended with {server.returncode}")
    return server, url


def raw(port: int, data: bytes, rcvbuf: int | None = None) -> socket.socket:
    """A client socket that sent `data` (a receive buffer of `rcvbuf` bytes: a client that reads little)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(data)
    return sock


def head(port: int, length: int) -> bytes:
    """The headers of a chat completion request whose body is `length` bytes."""
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def request(port: int, body: dict[str, Any]) -> bytes:
    """A whole chat completion request of `body`, as bytes for a raw socket."""
    data = json.dumps(body).encode()
    return head(port, len(data)) + data


def until(condition: Any, seconds: float = 300) -> float:
    """Seconds until condition() holds (polled every 10 ms)."""
    t0 = time.perf_counter()
    while not condition():
        if time.perf_counter() - t0 > seconds:
            raise TimeoutError("the condition never held")
        time.sleep(0.01)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client-timeout", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp()) / "serve.log"
    flags = ["--ctx", "4096", "--client-timeout", str(args.client_timeout), "--max-connections", "512"]
    server, url = serve(*flags, log=log)
    port = int(url.rsplit(":", 1)[1])
    try:
        health = lambda: httpx.get(f"{url}/health", timeout=10).json()  # noqa: E731
        t0 = time.perf_counter()
        httpx.post(f"{url}/v1/chat/completions", json=NORMAL, timeout=300).raise_for_status()
        alone = time.perf_counter() - t0

        deaf = raw(port, request(port, UNREAD), rcvbuf=4096)
        until(lambda: health()["busy"])
        halves = [raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127") for _ in range(40)]
        queued = [raw(port, request(port, {**UNREAD, "stream": False})) for _ in range(12)]
        until(lambda: health()["waiting"] == 12)
        for sock in queued:
            sock.close()
        emptied = until(lambda: health()["waiting"] == 0)
        t0 = time.perf_counter()
        httpx.post(f"{url}/v1/chat/completions", json=NORMAL, timeout=300).raise_for_status()
        behind = time.perf_counter() - t0
        dropped = "kept its answer waiting" in log.read_text()  # the worker's line for a stalled client

        idle = [raw(port, b"") for _ in range(300)]
        t0 = time.perf_counter()
        ok = httpx.get(f"{url}/health", timeout=30).status_code == 200
        idle_health = time.perf_counter() - t0
        for sock in [deaf, *halves, *idle]:
            sock.close()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    figures = {
        "client_timeout_s": args.client_timeout,
        "normal_alone_s": round(alone, 2),
        "normal_behind_s": round(behind, 2),
        "waiting_to_zero_s": round(emptied, 3),
        "unread_stream_dropped": dropped,
        "health_with_300_idle_sockets_s": round(idle_health, 3) if ok else None,
    }
    for name, value in figures.items():
        print(f"{name:34} {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    if os.environ.get("STALL_CHECK_LOG"):
        print(log.read_text())


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
