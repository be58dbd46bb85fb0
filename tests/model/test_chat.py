"""`localspec chat` driven through prompt-toolkit's pipe input, on the real models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.chat import drive
from support.same import assert_same_tokens

from localspec import LocalSpec
from localspec.core.sampling import SamplerSettings
from localspec.decoding.engine import Engine
from localspec.decoding.loader import RunConfig
from localspec.drafting.draft_model import DraftModelDrafter
from localspec.frontends.chat import DRAFT_COLOR
from localspec.frontends.conversation import Conversation
from localspec.llama.model import PREFILL_TILE, Model

GREEDY = SamplerSettings(temperature=0)


def _conv(target: Model, drafters: list, k: int, **kw: object) -> Conversation:
    """A greedy conversation on the public API over an engine of `target` with these drafters and k."""
    spec = LocalSpec(Engine(target, drafters, k), RunConfig(sampler=GREEDY, seed=0))
    return Conversation(spec, **kw)  # type: ignore[arg-type]


@pytest.fixture
def conv(target: Model, draft: Model) -> Conversation:
    target.reset()
    draft.reset()
    return _conv(target, [DraftModelDrafter(draft)], 4, max_tokens=48)


def test_second_turn_prefills_only_its_new_tokens(conv: Conversation) -> None:
    drive(conv, "What is 2 + 2? Answer briefly.\r/exit\r")
    first = conv._rendered(conv.messages[:-1])
    reply = conv.messages[-1]["tokens"]
    cached = list(conv.spec.engine.target.tokens)
    drive(conv, "And 3 + 3?\r/exit\r")
    second = conv._rendered(conv.messages[:-1])
    assert second[: len(first) + len(reply)] == first + reply  # the history renders as the same tokens
    reused = next(
        (i for i, (a, b) in enumerate(zip(cached, second, strict=False)) if a != b), min(len(cached), len(second))
    )
    assert reused >= len(first) + len(reply) - 1  # the whole history was still in the cache ...
    # ... and only the rest was decoded, as a prefill decodes it: from a whole tile, at least one tile
    kept = min(reused, len(second) - PREFILL_TILE) // PREFILL_TILE * PREFILL_TILE
    assert conv.last is not None and conv.last.prefill_tokens == len(second) - kept
    assert conv.last.prefill_tokens <= len(second) - len(first) - len(reply) + 2 * PREFILL_TILE


def test_greedy_replies_equal_target_alone(target: Model, draft: Model) -> None:
    turns = ["Write a Python one-liner that reverses a string.", "Now make it a function with a docstring."]
    replies = {}
    for k in (4, 0):
        target.reset()
        draft.reset()
        conv = _conv(target, [DraftModelDrafter(draft)] if k else [], k, max_tokens=48)
        drive(conv, "".join(t + "\r" for t in turns) + "/exit\r")
        replies[k] = conv
    spec, base = replies[4], replies[0]
    assert spec.totals.drafted > 0 and base.totals.drafted == 0
    for i in (1, 3):  # compare each assistant reply, given the same history before it
        prompt = base._rendered(base.messages[:i])
        assert_same_tokens(target, prompt, spec.messages[i]["tokens"], base.messages[i]["tokens"])
        if spec.messages[i]["tokens"] != base.messages[i]["tokens"]:
            break  # after a near tie the histories differ; later turns are no longer comparable


def test_ctrl_c_mid_reply_keeps_partial_reply_and_repl(conv: Conversation, tmp_path: Path) -> None:
    conv.max_tokens = 400
    saved = tmp_path / "conv.json"
    out = drive(conv, f"Write a long essay about the history of the ocean.\r/save {saved}\r/exit\r", interrupt_after=40)
    assert "[interrupted]" in out and f"saved {saved}" in out
    data = json.loads(saved.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    partial = data["messages"][1]["content"]
    assert partial and len(conv.messages[1]["tokens"]) < 400
    assert conv.last is not None and conv.last.finish_reason == "length"  # it did not finish by itself


def test_ctrl_c_at_prompt_clears_the_line(conv: Conversation) -> None:
    out = drive(conv, "this line is abandoned\x03/stats\r/exit\r")
    assert conv.messages == [] and "last reply: none yet" in out


def test_save_then_load_round_trips(conv: Conversation, target: Model, draft: Model, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    drive(conv, f"/system You answer in one word.\rCapital of France?\r/save {path}\r/exit\r")
    target.reset()
    draft.reset()
    other = _conv(target, [DraftModelDrafter(draft)], 4)
    out = drive(other, f"/load {path}\r/exit\r")
    assert f"loaded {path} (2 messages)" in out
    assert other.to_json() == conv.to_json() and other.system == "You answer in one word."
    assert len(target.tokens) > 20  # /load prefilled the conversation
    drive(other, "Capital of Italy?\r/exit\r")
    assert other.last is not None and other.last.prefill_tokens < 20 + 2 * PREFILL_TILE  # ... so the next turn
    # decodes only its own tokens (from a whole tile: a prompt is decoded as a fresh prefill would be)


def test_set_changes_the_settings_for_real(conv: Conversation) -> None:
    drive(
        conv, "/set k 6\r/set temperature 0.7\r/set top_k 5\r/set top_p 0.5\r/set min_p 0.2\r/set max_tokens 7\r/exit\r"
    )
    s = conv.sampler
    assert s is not None and conv.spec.k == 6 and conv.max_tokens == 7
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (0.7, 5, 0.5, 0.2)


def test_clear_system_color_and_history(conv: Conversation, tmp_path: Path) -> None:
    history = tmp_path / "history"
    out = drive(conv, "/color on\rHi!\r/stats\r/clear\r/exit\r", color=False, history=history)
    assert DRAFT_COLOR in out  # accepted draft tokens are colored once /color on
    assert "session (1 replies)" in out and "new conversation" in out
    assert conv.messages == [] and conv.spec.engine.target.tokens == []
    assert "Hi!" in history.read_text()  # persistent input history
    out = drive(conv, "/color off\rHi!\r/system Be terse.\r/exit\r", color=True)
    assert DRAFT_COLOR not in out and conv.system == "Be terse." and conv.messages == []


def test_context_overflow_leaves_the_oldest_turns_out_of_the_window(draft_path: Path, tmp_path: Path) -> None:
    """Past the context, the model is shown the newest turns that fit; the conversation and its file keep all."""
    small = Model(draft_path, n_ctx=256)
    conv = _conv(small, [], 0, system="Be brief.", max_tokens=16)
    filler = "Please remember this sentence about apples and oranges. " * 6
    autosave = tmp_path / "chat.json"
    out = drive(conv, "".join(f"{filler} Turn {i}: say ok.\r" for i in range(4)) + "/exit\r", autosave=autosave)
    assert "left out of what the model sees" in out
    assert conv.system == "Be brief." and conv.window[0]["role"] == "user"
    assert "Turn 0" not in conv.window[0]["content"] and "Turn 0" in conv.messages[0]["content"]
    assert len(conv._rendered(conv.window)) <= 256
    saved = [m["content"] for m in json.loads(autosave.read_text())["messages"] if m["role"] == "user"]
    assert len(saved) == 4 and "Turn 0" in saved[0]


def test_a_message_too_long_for_the_context_is_refused_and_every_turn_kept(draft_path: Path, tmp_path: Path) -> None:
    small = Model(draft_path, n_ctx=256)
    conv = _conv(small, [], 0, max_tokens=8)
    autosave = tmp_path / "last-chat.json"
    drive(conv, "Say ok.\r/exit\r", autosave=autosave)
    kept, saved = list(conv.messages), autosave.read_text()
    out = drive(conv, "apples and oranges " * 200 + "\r/exit\r", autosave=autosave)
    assert "too many" in out and "kept" in out
    assert conv.messages == kept and autosave.read_text() == saved  # nothing dropped, the saved chat intact


def test_schema_and_prediction_reach_the_reply(conv: Conversation, tmp_path: Path) -> None:
    """/schema makes every reply JSON valid against it; /predict drafts the next reply from a file."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    (tmp_path / "city.json").write_text(json.dumps(schema))
    (tmp_path / "bad.json").write_text('{"type": "no-such-type"}')
    out = drive(conv, f"/schema {tmp_path / 'bad.json'}\r/schema {tmp_path / 'city.json'}\rName a city.\r/exit\r")
    assert "error: response_format" in out
    assert "city" in json.loads(conv.messages[-1]["content"])
    code = "def add(a, b): return a + b  # the sum of a and b, as a one-line Python function"
    (tmp_path / "add.py").write_text(code)
    drive(conv, f"/schema off\r/predict {tmp_path / 'add.py'}\rRepeat this line exactly: {code}\r/exit\r")
    assert conv.last is not None and conv.last.drafted_by.get("prediction", 0) > 0
    assert conv.prediction is None  # used once
