"""A file rewrite through the OpenAI-compatible API: with and without a prediction, against the target alone.

Starts two `localspec serve` processes on free local ports, one as the user runs it (the defaults)
and one with --no-draft (the target alone), and sends each round's requests to both, interleaved:

    python scripts/bench_server.py --rounds 3 [--max-tokens 400] [--json out.json]

Each round asks to fix one bug in a 150-line file (the bench's edit-bugfix prompt, with a fresh
request number in front, so no request finds an earlier one's prompt cached): to the target alone
and to the default server without a prediction; then, with another number, to the target alone and
to the default server with the correct prediction (the target alone's answer, as an editor that
knows the answer would send it). It
reports each way's total time (request to last token) and time to first token, as the client sees
them, and the HTTP layer's share of the time to first token: the client's time to first token less
the server's own (from the request's arrival to its first text, `usage.localspec`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from localspec.frontends.bench_prompts import BUILTIN_PROMPTS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stall_check import serve


def _ask(url: str, prompt: str, max_tokens: int, prediction: str | None) -> dict[str, object]:
    """One streamed request: the text, client-side times, and the server's usage."""
    body: dict[str, object] = {
        "model": "localspec",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    t0, first, parts, usage = time.perf_counter(), None, [], dict[str, Any]()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and (text := chunk["choices"][0]["delta"].get("content")):
                first = first or time.perf_counter()
                parts.append(text)
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    return {"text": "".join(parts), "total": end - t0, "ttft": (first or end) - t0, "usage": usage}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--json", type=Path, help="write every request's figures here")
    args = parser.parse_args()
    task = next(p for p in BUILTIN_PROMPTS if p["task"] == "edit-bugfix")["prompt"]
    common = ["--model-alias", "localspec", "--ctx", "4096"]
    (spec_proc, spec_url), (alone_proc, alone_url) = serve(*common), serve(*common, "--no-draft")
    rows: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            fresh = [f"(request {os.getpid()}-{r}{part})\n{task}" for part in "ab"]
            alone = [_ask(alone_url, prompt, args.max_tokens, None) for prompt in fresh]
            plain = _ask(spec_url, fresh[0], args.max_tokens, None)
            predicted = _ask(spec_url, fresh[1], args.max_tokens, str(alone[1]["text"]))
            for way, result, reference in (
                ("target alone", alone[0], alone[0]),
                ("default", plain, alone[0]),
                ("target alone", alone[1], alone[1]),
                ("default + prediction", predicted, alone[1]),
            ):
                rows.append(
                    {
                        "round": r,
                        "way": way,
                        **{k: v for k, v in result.items() if k != "text"},
                        "same_text": result["text"] == reference["text"],
                    }
                )
            print(f"round {r}: " + ", ".join(f"{row['way']} {row['total']:.1f} s" for row in rows[-4:]), flush=True)
    finally:
        for proc in (spec_proc, alone_proc):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    base = median(float(row["total"]) for row in rows if row["way"] == "target alone")
    print(f"\n{'way':22} {'total s':>8} {'first token s':>13} {'HTTP share':>10} {'vs target alone':>15}")
    for way in ("target alone", "default", "default + prediction"):
        mine = [row for row in rows if row["way"] == way]
        total = median(float(row["total"]) for row in mine)
        ttft = median(float(row["ttft"]) for row in mine)
        share = median(1 - float(row["usage"]["localspec"]["time_to_first_token"]) / float(row["ttft"]) for row in mine)
        print(f"{way:22} {total:8.2f} {ttft:13.2f} {share:10.1%} {base / total:14.2f}×")
    print("texts equal to the target alone's:", all(row["same_text"] for row in rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
