"""Files localspec writes survive two processes and damage: caches rebuilt, chats whole, models verified."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from localspec.llama.grammar import _cached_pieces, vocab_cache
from localspec.llama.model import Model
from localspec.models.vocab import mismatch
from localspec.paths import cache_dir


@pytest.mark.slow
@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 truncated", b"not an archive"])
def test_a_damaged_grammar_cache_is_set_aside_and_rebuilt(target: Model, damage: bytes) -> None:
    pieces, eog = _cached_pieces(target)  # made, or read
    path = vocab_cache(target)
    path.write_bytes(damage)
    assert _cached_pieces(target) == (pieces, eog)
    assert path.with_name(path.name + ".damaged").read_bytes() == damage
    with zipfile.ZipFile(path) as zf:  # rebuilt whole
        assert zf.testzip() is None


@pytest.mark.slow
def test_a_damaged_vocabulary_check_store_is_rebuilt(target_path: Path, draft_path: Path, gemma_path: Path) -> None:
    store = cache_dir() / "vocab-checks.json"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text('{"half": ')
    assert mismatch(target_path, draft_path) is None
    assert mismatch(target_path, gemma_path)  # a real mismatch, remembered beside the first
    assert len(json.loads(store.read_text())) == 2 and store.with_name("vocab-checks.json.damaged").exists()


@pytest.mark.slow  # assembles a real model package twice at once
def test_two_installs_at_once_give_one_verified_file(tmp_path: Path, gemma_path: Path) -> None:
    env = {"LOCALSPEC_MODELS_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "localspec", "models", "install", "gemma-3-270m"]
    procs = [subprocess.Popen(cmd, env={**os.environ, **env}, stderr=subprocess.PIPE) for _ in "ab"]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert (tmp_path / "gemma-3-270m-q4_k_m.gguf").read_bytes() == gemma_path.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
