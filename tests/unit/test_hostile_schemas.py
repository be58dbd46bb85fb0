"""Schemas that once killed the server (llguidance follows $ref links recursively: a long chain overflowed the
thread's stack, a segfault): a real server in a process of its own, the stand-in engine behind it, must answer each
such request, a too large one with an OpenAI-shaped 400 naming its field, and go on answering /health."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localspec.core.grammar import MAX_SCHEMA_NODES

ROOT = Path(__file__).resolve().parents[2]
SERVE = (
    "import sys, time; sys.path[:0] = {paths!r}; from support.standin import Served, StandIn; "
    "s = Served(StandIn(), timeout=30); print(s.port, flush=True); time.sleep(600)"
)


def chain(links: int, heavy: bool = False) -> dict[str, Any]:
    """A schema whose $ref links run `links` long (heavy: each link an object holding an optional array of the next)."""

    def link(i: int) -> dict[str, Any]:
        ref = {"$ref": f"#/$defs/a{i + 1}"}
        if not heavy:
            return ref
        return {"type": "object", "properties": {"x": {"anyOf": [{"type": "array", "items": ref}, {"type": "null"}]}}}

    defs = {f"a{i}": link(i) for i in range(links)}
    defs[f"a{links}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE.format(paths=[str(ROOT / "tests"), str(ROOT / "scripts")])],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()  # the event: the server listens
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def bodies(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(path, body, the field a refusal names): the schema through each door a schema comes in by."""
    chat = {"model": "standin", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return [
        ("/v1/chat/completions", {**chat, "response_format": fmt}, "response_format"),
        ("/v1/chat/completions", {**chat, "tools": [tool]}, "tools"),
        (
            "/v1/responses",
            {
                "model": "standin",
                "input": "hi",
                "max_output_tokens": 2,
                "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
            },
            "text",
        ),
    ]


@pytest.mark.parametrize(
    ("schema", "fits"), [(chain(3000), True), (chain(1500, heavy=True), True), (chain(30000), False)]
)
def test_a_long_ref_chain_is_answered_and_the_server_lives(server: str, schema: dict[str, Any], fits: bool) -> None:
    with httpx.Client(base_url=server, timeout=120) as client:
        for path, body, field in bodies(schema):
            reply = client.post(path, json=body)
            if fits:
                assert reply.status_code == 200, (path, reply.text[:300])
            else:
                assert reply.status_code == 400, (path, reply.text[:300])
                error = reply.json()["error"]
                assert error["param"].startswith(field) and f"{MAX_SCHEMA_NODES:,}" in error["message"], error
            assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        (
            "/v1/responses",
            '{"model": "standin", "input": "hi", "metadata": {"a": ' + "[" * 300 + "]" * 300 + "}}",
            "nested deeper than",
        ),
        (
            "/v1/chat/completions",
            '{"model": "standin", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
            '"function": {"name": "f", "parameters": '
            + '{"type": "array", "items": ' * 400
            + "{}"
            + "}" * 400
            + "}}]}",
            "nested deeper than",
        ),
        ("/v1/responses", '{"model": "standin", "input": "hi", "metadata": {"a": NaN}}', "NaN or Infinity"),
        ("/v1/responses", '{"model": "standin", "input": "hi", "temperature": Infinity}', "NaN or Infinity"),
        (
            "/v1/chat/completions",
            '{"model": "standin", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": '
            '"json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "maximum": -Infinity}}}}',
            "NaN or Infinity",
        ),
    ],
    ids=["deep-metadata", "deep-tool-parameters", "nan-metadata", "infinite-temperature", "infinite-schema-bound"],
)
def test_deep_nesting_and_numbers_json_lacks_get_a_400(server: str, path: str, body: str, said: str) -> None:
    """Nesting hundreds of levels deep in any field, NaN and Infinity anywhere: an OpenAI-shaped 400 saying what,
    before anything is generated; the server answers /health after each."""
    with httpx.Client(base_url=server, timeout=60) as client:
        reply = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert reply.status_code == 400 and said in reply.json()["error"]["message"], reply.text[:300]
        assert client.get("/health").status_code == 200
