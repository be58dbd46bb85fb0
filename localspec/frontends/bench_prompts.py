"""The built-in bench prompt set, kept as data beside this module (prompts/bench.jsonl): code edits of three
shapes, summaries, open chats, short prompts, new code, JSON extracted under a schema, and an editor's
fill-in-the-middle autocomplete; prompts/fim.jsonl holds six such autocomplete requests (the replay's).

A row is what `localspec bench --prompts FILE.jsonl` reads: {"task", "prompt", optional "response_format"
(OpenAI's), optional "suffix" (a fill-in-the-middle's)}.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any


def read_rows(text: str) -> list[dict[str, Any]]:
    """Prompt rows from JSONL text; ValueError, KeyError or TypeError where a line is not such a row."""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [
        {
            "task": str(r.get("task", f"prompt-{i + 1}")),
            "prompt": str(r["prompt"]),
            **({"response_format": r["response_format"]} if r.get("response_format") else {}),
            **({"suffix": str(r["suffix"])} if r.get("suffix") is not None else {}),
        }
        for i, r in enumerate(rows)
    ]


def _packaged(name: str) -> list[dict[str, Any]]:
    return read_rows(files("localspec.frontends").joinpath(f"prompts/{name}").read_text(encoding="utf-8"))


BUILTIN_PROMPTS = _packaged("bench.jsonl")
FIM_PROMPTS = _packaged("fim.jsonl")
STRUCTURED_PROMPT = next(p for p in BUILTIN_PROMPTS if p["task"] == "json-extract")
CUSTOMER_SCHEMA: dict[str, Any] = STRUCTURED_PROMPT["response_format"]["json_schema"]["schema"]
