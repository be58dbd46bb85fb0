"""Stored responses (the Responses API's `store` and `previous_response_id`), model-free: the official openai SDK
against the real app over the stand-in engine; a restart between turns keeps them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from support.standin import Served, StandIn, serving

from localspec.frontends.server.stored import ResponseStore


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def served(cache: Path) -> Iterator[Served]:
    with serving(StandIn()) as s:
        yield s


def _client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)


def test_a_conversation_continues_from_its_last_response(served: Served) -> None:
    """Each turn sends only its new input: the prompt holds the turns before (the stand-in counts a word a token),
    the instructions are the new request's own; the response names the one it continued."""
    client = _client(served)
    first = client.responses.create(model="standin", input="one two three", max_output_tokens=2)
    assert first.to_dict()["store"] is True and first.output_text == "word word "
    second = client.responses.create(
        model="standin", input="four", previous_response_id=first.id, max_output_tokens=2, instructions="be brief"
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    # the first turn's input and answer, then "four" and the instructions: all in the prompt
    assert second.usage.input_tokens == first.usage.input_tokens + 2 + 1 + 2
    third = client.responses.create(model="standin", input="five", previous_response_id=second.id, max_output_tokens=1)
    assert third.usage is not None and third.usage.input_tokens == second.usage.input_tokens - 2 + 2 + 1
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_not_stored_deleted_and_unknown_responses_are_404s(served: Served) -> None:
    client = _client(served)
    unstored = client.responses.create(model="standin", input="hi", max_output_tokens=1, store=False)
    assert unstored.to_dict()["store"] is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="standin", input="hi", previous_response_id=unstored.id)
    assert missing.value.body["param"] == "previous_response_id"  # type: ignore[index]
    kept = client.responses.create(model="standin", input="hi", max_output_tokens=1)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    assert httpx.get(f"{served.url}/v1/responses/../../etc/passwd").status_code == 404


def test_a_restart_between_turns_keeps_the_conversation(cache: Path) -> None:
    s = Served(StandIn())
    try:
        first = _client(s).responses.create(model="standin", input="one two three", max_output_tokens=2)
    finally:
        s.stop()
    again = Served(StandIn())
    try:
        second = _client(again).responses.create(
            model="standin", input="four", previous_response_id=first.id, max_output_tokens=1
        )
        assert first.usage is not None and second.usage is not None
        assert second.usage.input_tokens == first.usage.input_tokens + 2 + 1
    finally:
        again.stop()


def test_the_store_keeps_the_newest_and_sets_a_damaged_file_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ResponseStore(tmp_path, limit=3)
    ids = [f"resp_{i:024x}" for i in range(5)]
    for rid in ids:
        store.put(rid, {"id": rid}, [{"role": "user", "content": rid}])
        assert store.get(rid) is not None  # at once: a next turn may name it before its file is written
    store.flush()
    assert [store.get(rid) is not None for rid in ids] == [False, False, True, True, True]
    (tmp_path / f"{ids[4]}.json").write_text('{"response": {"id"')
    assert store.get(ids[4]) is None and len(capsys.readouterr().err.strip().splitlines()) == 1
    assert store.get("resp_../../x") is None and not store.delete("../x")
