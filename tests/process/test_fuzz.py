"""Fuzzing `localspec serve` with schemathesis from its own OpenAPI schema: every endpoint, a bounded number
of generated requests (valid and invalid), against a real server on a free local port.

Every response must be a success or a 4xx in the API's error shape (OpenAI's; Anthropic's on /v1/messages), never
a 5xx, and the server must stay healthy.
`LOCALSPEC_FUZZ_EXAMPLES` raises the count (the CI run keeps it small: a valid request generates text).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from support.server import Server

EXAMPLES = int(os.environ.get("LOCALSPEC_FUZZ_EXAMPLES", "20"))


@pytest.fixture(scope="module")
def fuzzed(draft_path: Path) -> Iterator[Server]:
    """The small model as the target, a short context, nothing loaded beside it: refusals are the subject, and a
    valid request's answer is short and quick."""
    s = Server("--target", str(draft_path), "--ctx", "128", "--max-queue", "4", "--no-draft")
    yield s
    assert httpx.get(f"{s.url}/health").json()["status"] == "ok"  # healthy after it all
    assert s.stop() == 0
    assert "Traceback" not in s.log_path.read_text()


@pytest.fixture(scope="module")
def api_schema(fuzzed: Server) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def _check(response: schemathesis.Response, path: str) -> None:
    """Never a 5xx; a refusal is {"error": {"message", "type", "param", "code"}} with a message, or on Anthropic's
    paths {"type": "error", "error": {"type", "message"}}."""
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        body = response.json()
        if path.startswith("/v1/messages"):
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, response.text
            assert body["error"]["message"], response.text
            return
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], response.text


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_server_error(case: schemathesis.Case, fuzzed: Server) -> None:
    _check(case.call(base_url=fuzzed.url, timeout=120), case.path)
