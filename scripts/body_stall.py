"""How long a large request body stalls every other client: `/health`'s slowest answer while 15 MiB bodies of tiny
items arrive, model-free (the tests' stand-in engine under the real app, served by uvicorn on a free local port).

    python scripts/body_stall.py

Prints, per body, its status and the slowest `/health` answer during it (the loop's stall), median of 3.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from standin import StandIn, serving

MiB = 2**20
BODIES = {
    "Responses reasoning items": ("/v1/responses", "input", {"type": "reasoning", "summary": []}),
    "chat text parts": ("/v1/chat/completions", "messages", None),
    "completions prompt list": ("/v1/completions", "prompt", "a"),
    "chat messages": ("/v1/chat/completions", "messages", {"role": "user", "content": "a"}),
    "one 15 MiB message": ("/v1/chat/completions", "messages", "big"),
}


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def body(field: str, item: object) -> bytes:
    """About 15 MiB: `item` repeated in `field` (None: one message of text parts; "big": one long message)."""
    if item is None:
        part = {"type": "text", "text": "a"}
        parts = [part] * (15 * MiB // (len(_json(part)) + 1))
        return _json({"model": "standin", field: [{"role": "user", "content": parts}], "max_tokens": 1})
    if item == "big":
        return _json({"model": "standin", field: [{"role": "user", "content": "a" * 15 * MiB}], "max_tokens": 1})
    return _json({"model": "standin", field: [item] * (15 * MiB // (len(_json(item)) + 1)), "max_tokens": 1})


def stall(url: str, path: str, data: bytes) -> tuple[int, float]:
    """(the body's status, the slowest /health answer while it was sent and answered)."""
    done, worst = threading.Event(), [0.0]

    def probe() -> None:
        with httpx.Client() as client:
            while not done.is_set():
                t0 = time.perf_counter()
                client.get(f"{url}/health")
                worst[0] = max(worst[0], time.perf_counter() - t0)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        status = httpx.post(
            url + path, content=data, headers={"Content-Type": "application/json"}, timeout=120
        ).status_code
    finally:
        done.set()
        prober.join()
    return status, worst[0]


def main() -> None:
    with serving(StandIn()) as served:
        print("| body (about 15 MiB) | status | slowest /health, median of 3 |\n|---|---|---|")
        for name, (path, field, item) in BODIES.items():
            data = body(field, item)
            runs = [stall(served.url, path, data) for _ in range(3)]
            print(f"| {name} | {runs[0][0]} | {statistics.median(w for _, w in runs):.3f} s |")


if __name__ == "__main__":
    main()
