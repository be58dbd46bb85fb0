"""An installed model file checked against its pin (size and sha256), and the stamp that records the check so a
file that has not changed since is not hashed again."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from localspec.errors import LocalspecError
from localspec.files import write_json

CHUNK = 8 << 20  # bytes read (and hashed) at a time


class Pinned(Protocol):
    """A model file's pin: what a catalog entry says of it."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int | None: ...

    @property
    def sha256(self) -> str | None: ...


def stamp_path(path: Path) -> Path:
    """The file that records a verified install of path."""
    return path.with_name(f".{path.name}.verified")


def is_verified(model: Pinned, path: Path) -> bool:
    """True when path is the catalog file, checked by an earlier install (size, mtime and hash stamp)."""
    try:
        st, stamp = path.stat(), json.loads(stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or (stamp.get("size"), stamp.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
        return False
    if model.sha256 is None:  # pinned at its install by what the Hub published (install.py): that check holds
        return isinstance(stamp.get("sha256"), str) and (model.size is None or model.size == st.st_size)
    return stamp == {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_stamp(model: Pinned, path: Path) -> None:
    """Record that `path` was checked; where its folder cannot be written (read-only), the file is checked again
    next time instead."""
    st = path.stat()
    with contextlib.suppress(OSError):
        write_json(stamp_path(path), {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})


def check_installed(model: Pinned, path: Path) -> None:
    """Refuse (LocalspecError) to load an installed catalog file that is not the catalog's: its size first;
    then, where it changed since its install's stamp (or has none), its hash (a stamp is written when it holds)."""
    if is_verified(model, path):
        return
    again = f"run `localspec models install {model.name}` again"
    if model.size is None or model.sha256 is None:
        raise LocalspecError(f"{path} was not installed and verified by localspec: {again}")
    size = path.stat().st_size
    if size != model.size:
        raise LocalspecError(f"{path} is incomplete or damaged ({size:,} of {model.size:,} bytes): {again}")
    print(f"localspec: checking {path.name} (it changed since it was installed) …", file=sys.stderr)
    if sha256_file(path) != model.sha256:
        raise LocalspecError(f"{path} is damaged (its sha256 is not the catalog's): {again}")
    write_stamp(model, path)


def sha256_file(path: Path, progress: Callable[[int], object] | None = None) -> str:
    """Hex sha256 of a file; progress(n_bytes) is called as it reads."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
            if progress:
                progress(len(block))
    return h.hexdigest()
