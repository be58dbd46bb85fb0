"""JSON under a schema through the API, drafted against the target alone: chat completions' `response_format`
and the Responses API's `text.format`, each with `speculative.n_max: 0` (the target alone) and without (drafting,
the grammar's forced tokens among the drafts), interleaved, on one running server:

    localspec serve --port 8080 &
    python scripts/bench_json.py --url http://127.0.0.1:8080/v1 --rounds 3

Prints, per API and prompt, the median time of each way as the client sees it, the ratio, and what was drafted.
"""

from __future__ import annotations

import argparse
import time
from statistics import median
from typing import Any

import openai

SCHEMA = {
    "type": "array",
    "minItems": 3,
    "maxItems": 3,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "languages": {"type": "array", "items": {"type": "string"}},
            "employer": {"type": "string"},
        },
        "required": ["name", "age", "languages", "employer"],
        "additionalProperties": False,
    },
}
PROMPTS = [
    "List three programmers as JSON: name, age, languages, employer.",
    "Describe three engineers at startups as JSON: name, age, languages, employer.",
]


def ask(client: openai.OpenAI, model: str, api: str, prompt: str, n_max: int | None) -> tuple[float, dict[str, Any]]:
    extra = {"speculative.n_max": n_max} if n_max is not None else {}
    t0 = time.perf_counter()
    if api == "chat":
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "people", "schema": SCHEMA}}
        messages: Any = [{"role": "user", "content": prompt}]
        reply: Any = client.chat.completions.create(
            model=model, messages=messages, response_format=fmt, temperature=0, max_tokens=300, extra_body=extra
        )
    else:
        text: Any = {"format": {"type": "json_schema", "name": "people", "schema": SCHEMA}}
        reply = client.responses.create(
            model=model, input=prompt, text=text, temperature=0, max_output_tokens=300, extra_body=extra
        )
    return time.perf_counter() - t0, reply.usage.model_extra["localspec"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url, api_key="unused", timeout=600)
    model = client.models.list().data[0].id
    for prompt in PROMPTS:
        for api in ("chat", "responses"):
            times: dict[int | None, list[float]] = {0: [], None: []}
            figures: dict[str, Any] = {}
            for r in range(args.rounds):
                for n_max in (0, None) if r % 2 == 0 else (None, 0):
                    seconds, figures[str(n_max)] = ask(client, model, api, prompt, n_max)
                    times[n_max].append(seconds)
            alone, drafted = median(times[0]), median(times[None])
            f = figures["None"]
            print(
                f"{api:9} {prompt[:40]!r}: n_max 0 {alone:.2f} s, drafting {drafted:.2f} s, {alone / drafted:.2f}x "
                f"({f['accepted']}/{f['drafted']} drafts accepted, by {f['accepted_by']})"
            )


if __name__ == "__main__":
    main()
