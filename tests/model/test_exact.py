"""Exact batches (--exact): where the llama.cpp build allows it, drafting changes no token, near ties included.

The slow tests here need llama-cpp-python built without llamafile's kernels
(CMAKE_ARGS="-DGGML_LLAMAFILE=OFF", docs/guide.md); with the stock build they check the one-line refusal instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localspec.api import LocalSpec
from localspec.llama.model import TILED_MIN_ROWS, llamafile_built

EXACT_BUILD = not llamafile_built()
SCHEMA = {
    "type": "object",
    "properties": {
        "employees": {
            "type": "array",
            "minItems": 4,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                    "department_name": {"type": "string"},
                },
                "required": ["name", "age", "department_name"],
            },
        }
    },
    "required": ["employees"],
}


@pytest.mark.skipif(EXACT_BUILD, reason="this llama.cpp build has no llamafile kernels")
def test_exact_is_refused_in_one_line_by_a_build_with_llamafile(target_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "localspec", "generate", "--exact", "-n", "2", "hi"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("localspec: error: exact batches need")


@pytest.mark.skipif(not EXACT_BUILD, reason="needs llama-cpp-python built with CMAKE_ARGS=-DGGML_LLAMAFILE=OFF")
def test_exact_batches_change_no_token(target_path: Path, draft_path: Path) -> None:
    """Greedy JSON under a schema and a seeded limerick: with the draft model drafting (k=4) the very tokens of
    the target alone, no near-tie allowance (the default mode parts on both on some machines)."""
    alone = LocalSpec.load(no_draft=True, exact=True, gpu_layers=0)
    asks: list[tuple[str, dict[str, Any]]] = [
        (
            "Invent four employees of a small company, as JSON.",
            {"temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
        ),
        ("Write a limerick about a cat who learns to code.", {"temperature": 0.9, "seed": 11}),
    ]
    want = [_tokens(alone, p, kw) for p, kw in asks]
    del alone
    drafting = LocalSpec.load(exact=True, k=4, gpu_layers=0, draft_gpu_layers=0)
    # Q4_K_M: verify batches below the tiled kernels' 8 rows, and below what this machine's own kernels change at
    # (measured: a CPU's repacked weights take another kernel from 4 rows on some CPUs)
    rows = drafting.engine.max_draft
    assert rows is not None and 1 <= rows <= TILED_MIN_ROWS - 2
    for (p, kw), tokens in zip(asks, want, strict=True):
        run = drafting.generate(p, max_tokens=120, **kw)
        assert run.result() and run.stats.drafted > 0, json.dumps(run.text)
        assert run.tokens == tokens, json.dumps(run.text)


def _tokens(spec: LocalSpec, prompt: str, options: dict[str, Any]) -> list[int]:
    run = spec.generate(prompt, max_tokens=120, **options)
    run.result()
    return run.tokens


@pytest.mark.skipif(not EXACT_BUILD, reason="needs llama-cpp-python built with CMAKE_ARGS=-DGGML_LLAMAFILE=OFF")
def test_nothing_that_measures_changes_the_text_in_exact_mode(
    target_path: Path, draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seeded prompt on a new machine (no costs kept, no answers): the target alone, the default's first answer
    (its costs learned from its own rounds, whatever it probes or tries), and the same prompt asked again with
    recall drafting the repeat (at k 2: exact batches of this CPU's 3 rows) are one text, token for token."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    prompt, options = "Write a limerick about a cat who learns to code.", {"temperature": 0.9, "seed": 11}
    alone = LocalSpec.load(no_draft=True, exact=True, gpu_layers=0, cache_disk=0)
    want = _tokens(alone, prompt, options)
    del alone
    default = LocalSpec.load(exact=True, gpu_layers=0, draft_gpu_layers=0, cache_disk=0)
    assert _tokens(default, prompt, options) == want
    default.save_costs()
    del default
    recalled = LocalSpec.load(exact=True, k=2, gpu_layers=0, draft_gpu_layers=0, cache_disk=0)
    again = recalled.generate(prompt, max_tokens=120, **options)
    again.result()
    assert again.tokens == want and again.stats.drafted_by.get("recall", 0) > 0, json.dumps(again.text)
