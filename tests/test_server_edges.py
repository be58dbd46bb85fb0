"""Small things clients meet, model-free (the stand-in answers): HEAD /health, a key that is not ASCII, and
tool_choice "required" with no tools."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from standin import Served, StandIn

KEY = "clé-ключ-鍵"
AUTH = {b"Authorization": f"Bearer {KEY}".encode()}  # UTF-8 bytes, as curl and the SDKs send it


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served(StandIn(), api_key=KEY)
    yield s
    s.stop()
    assert not any("Traceback" in line for line in s.log), s.log


def test_head_health_answers_as_get_does(served: Served) -> None:
    assert httpx.head(f"{served.url}/health").status_code == 200


def test_a_key_that_is_not_ascii_matches_as_clients_send_it(served: Served) -> None:
    url = f"{served.url}/v1/models"
    assert httpx.get(url, headers=AUTH).status_code == 200
    assert httpx.get(url, headers={"Authorization": "Bearer cle"}).status_code == 401


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
        ("/v1/responses", {"input": "hi", "tool_choice": "required"}),
    ],
)
def test_required_tool_choice_without_tools_is_a_400(served: Served, path: str, body: dict) -> None:
    answer = httpx.post(f"{served.url}{path}", json={"model": "standin", **body}, headers=AUTH)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "tool_choice"


def _post(served: Served, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served.url}{path}", json={"model": "standin", **body}, headers=AUTH)


def test_a_responses_input_error_names_where_it_is_and_what_fits_there(served: Served) -> None:
    bad = _post(served, "/v1/responses", {"input": [{"type": "message", "role": "user", "content": 5}]})
    error = bad.json()["error"]
    assert bad.status_code == 400 and error["param"] == "input.0.message.content", error
    assert "valid string" in error["message"] and "valid list" in error["message"]
    assert "str" not in error["param"].split(".")


def test_context_errors_name_the_responses_fields() -> None:
    s = Served(StandIn(), n_ctx=100)
    try:
        long = httpx.post(f"{s.url}/v1/responses", json={"model": "standin", "input": "word " * 200})
        assert long.status_code == 400 and long.json()["error"]["param"] == "input"
        capped = {"model": "standin", "input": "hi", "max_output_tokens": 500}
        over = httpx.post(f"{s.url}/v1/responses", json=capped)
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_output_tokens"
        assert "max_output_tokens = 500" in over.json()["error"]["message"]
    finally:
        s.stop()
