"""Claude Code itself against `localspec serve`: the agent Anthropic ships (`npm install @anthropic-ai/claude-code`),
which speaks only Anthropic's Messages API, pointed at the server as a user points it (ANTHROPIC_BASE_URL and a
dummy ANTHROPIC_API_KEY).

Its own system prompt and 24 tools are 18,800 tokens (minutes of prefill on a 2-core CPU, measured in
docs/server.md); `--bare`, a one-line system prompt and one tool keep each request brief here (the protocol is
the same). Skipped where npm is missing or cannot fetch the package."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.commands import npm_installed
from support.server import Server

ANSWERED = re.compile(r"POST /v1/messages 200 (\d+)\+\d+ tokens \((\d+) cached\), first token ([\d.]+) s")


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return npm_installed(tmp_path_factory, "@anthropic-ai/claude-code", "claude")


@pytest.fixture(scope="module")
def agent_server(target_path: Path, draft_path: Path) -> Iterator[Server]:
    s = Server("--ctx", "8192", "--temperature", "0")  # Claude Code sends no temperature: greedy answers repeat
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.log_path.read_text()


def _ask(claude: Path, server: Server, home: Path, question: str) -> str:
    """One Claude Code session (`claude -p`): its answer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env |= {"HOME": str(home), "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "unused"}
    env |= {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    brief = ["--bare", "--system-prompt", "You are a terse assistant. Answer in one line.", "--tools", "Read"]
    done = subprocess.run(
        [str(claude), *brief, "-p", question],  # -p after --tools, whose list would take the question
        cwd=home,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=900,
    )
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, (out[-2000:], done.stderr.decode(errors="replace")[-2000:])
    return out


def test_claude_code_answers_and_a_second_session_reads_the_cache(
    claude: Path, agent_server: Server, tmp_path: Path
) -> None:
    """`claude -p` answers; a second session's prompt (another question) is read from the cache but for its
    question, and its first token comes in a quarter of the first session's time or less."""
    assert "4" in _ask(claude, agent_server, tmp_path, "What is 2+2? Answer with the number only.")
    first = ANSWERED.findall(agent_server.log_path.read_text())
    assert "8" in _ask(claude, agent_server, tmp_path, "What is 3+5? Answer with the number only.")
    second = ANSWERED.findall(agent_server.log_path.read_text())[len(first) :]
    prompt, cached, ttft = (float(x) for x in second[0])
    print(f"first session {first}, second {second}")
    assert cached >= 0.9 * prompt, second
    assert ttft <= 0.25 * float(first[0][2]), (first, second)
