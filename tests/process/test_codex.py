"""Codex CLI itself against `localspec serve`: the agent OpenAI ships (`npm install @openai/codex`), which speaks
only the Responses API, configured as a new user configures a local provider.

Codex's own system prompt is several thousand tokens; a short instructions file keeps the first prefill brief here
(the protocol is the same; docs/server.md gives the full configuration). Skipped where npm is missing or cannot
fetch the package."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.commands import npm_installed
from support.server import MODEL, Server


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return npm_installed(tmp_path_factory, "@openai/codex", "codex")


@pytest.fixture(scope="module")
def agent_server(target_path: Path, draft_path: Path) -> Iterator[Server]:
    s = Server("--ctx", "8192", "--temperature", "0")  # Codex sends no temperature: greedy answers repeat
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.log_path.read_text()


@pytest.fixture(scope="module")
def codex_home(tmp_path_factory: pytest.TempPathFactory, agent_server: Server) -> Path:
    """One Codex home for the module: its path is in Codex's prompt, so the tests share the prompt's long start
    (tools and instructions) as one user's sessions do, and the server's prompt cache holds it."""
    root = tmp_path_factory.mktemp("codex")
    home = root / "codex-home"
    home.mkdir()
    instructions = root / "instructions.md"
    instructions.write_text(
        "You are a coding agent in a terminal. Answer briefly. Run shell commands with exec_command.\n"
    )
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "localspec"\n'
        f'model_instructions_file = "{instructions}"\n'
        "[model_providers.localspec]\n"
        'name = "localspec"\n'
        f'base_url = "{agent_server.url}/v1"\n'
        'wire_api = "responses"\n'
        "[features]\n"
        "goals = false\n"
    )
    return home


def _exec(codex: Path, home: Path, workdir: Path, prompt: str) -> list[dict[str, Any]]:
    """`codex exec --json PROMPT` in `workdir`: its events, one JSON object a line."""
    done = subprocess.run(
        [str(codex), "exec", "--json", "--skip-git-repo-check", prompt],
        cwd=workdir,
        env={**_env(), "CODEX_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=900,
    )
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, (out[-2000:], done.stderr.decode(errors="replace")[-2000:])
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _env() -> dict[str, str]:
    """This environment without OpenAI's keys or endpoints (Codex must use the configured provider)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}


def test_codex_answers_a_question(codex: Path, codex_home: Path, tmp_path: Path) -> None:
    events = _exec(codex, codex_home, tmp_path, "What is 2+2? Answer with the number only.")
    messages = [e["item"] for e in events if e.get("type") == "item.completed"]
    assert any(m.get("type") == "agent_message" and "4" in str(m.get("text")) for m in messages), events
    assert events[-1]["type"] == "turn.completed"


def test_codex_runs_its_shell_tool_and_goes_on(
    codex: Path, codex_home: Path, tmp_path: Path, agent_server: Server
) -> None:
    """The model's call of exec_command is a well-formed function_call that Codex runs; the next request, which
    carries the command's output, completes the turn."""
    (tmp_path / "notes.txt").write_text("localspec-marker-7\n")
    events = _exec(codex, codex_home, tmp_path, "Use the exec_command tool to run: cat notes.txt")
    commands = [
        e["item"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == "command_execution"
    ]
    assert commands and "localspec-marker-7" in str(commands[0].get("aggregated_output")), events
    assert events[-1]["type"] == "turn.completed"
    log = agent_server.log_path.read_text()
    assert log.count("POST /v1/responses 200") >= 2
