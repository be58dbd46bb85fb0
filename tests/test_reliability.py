"""Bad input: one clear line, exit code 2, no traceback; special tokens stay text; a closed pipe is quiet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localspec.model import Model
from localspec.prompt import chat_tokens

from conftest import run_cli


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    for needle in needles:
        assert needle in proc.stderr


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
    return {"missing": d / "missing.gguf", "directory": d / "dir.gguf", "not GGUF": d / "text.gguf",
            "truncated": d / "half.gguf", "corrupt": d / "corrupt.gguf"}


@pytest.mark.parametrize("case,expect", [("missing", "no such model file"), ("directory", "is a directory"),
                                         ("not GGUF", "not a GGUF file"), ("truncated", "truncated"),
                                         ("corrupt", "corrupt GGUF header")])
@pytest.mark.parametrize("role", ["--target", "--draft"])
def test_bad_model_files(bad_files, target_path, case: str, expect: str, role: str) -> None:
    path = bad_files[case]
    _one_line_error(run_cli("generate", "hi", role, str(path)), str(path), expect)


def test_empty_prompt_and_invalid_utf8(target_path) -> None:
    _one_line_error(run_cli("generate", "   "), "empty")
    _one_line_error(run_cli("generate", input=b"caf\xe9 \xff"), "not valid UTF-8")


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
