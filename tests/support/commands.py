"""The real `localspec` command and real clients, run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(
    *args: str, input: bytes | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real `localspec` command in a subprocess (bytes in, text out; env adds variables)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "localspec", *args], input=input, capture_output=True, timeout=timeout, env=env
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    )


def npm_installed(tmp_path_factory: pytest.TempPathFactory, package: str, binary: str) -> Path:
    """`package` installed by npm into a temporary folder: the path of its `binary` (the test skipped where npm is
    missing or cannot fetch the package)."""
    import shutil

    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    root = tmp_path_factory.mktemp(binary)
    got = subprocess.run([npm, "install", "--prefix", str(root), package], capture_output=True, timeout=600)
    if got.returncode != 0:
        pytest.skip(f"npm could not install {package}: {got.stderr.decode(errors='replace')[-400:]}")
    return root / "node_modules" / ".bin" / binary


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2 with exactly one line on stderr, containing each needle, and no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
