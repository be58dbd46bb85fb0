"""Files localspec writes stay whole and are verified before use, without a model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.errors import LocalspecError
from localspec.models.catalog import catalog, resolve

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
