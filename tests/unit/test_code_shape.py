"""The code's own rules, held by a test: no function longer than a screen (60 lines) in localspec/, scripts/ or
tests/, but the simulator's session, which goes when the simulator drives the real round."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60
KNOWN: set[str] = set()


def test_no_function_is_longer_than_a_screen() -> None:
    long = []
    for folder in ("localspec", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    name = f"{path.relative_to(ROOT).as_posix()}:{node.name}"
                    if lines > MAX_LINES and name not in KNOWN:
                        long.append(f"{name} ({lines} lines)")
    assert not long, long
