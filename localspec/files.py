"""Files that localspec writes: read whole or not at all, written atomically, locked where processes share them.

Every file is written under a unique temporary name beside it and moved into place once complete
(atomic_file), so a reader never sees half a file and a crash leaves the old one. A shared JSON file is
changed under its lock (a `.lock` beside it, filelock): the writer reads the current contents, changes
them and replaces the file, so two processes never lose each other's entries. A damaged file (not JSON,
or not the shape its reader expects) is set aside as `NAME.damaged` with a one-line note and its contents
start afresh; nothing raises on a cache that cannot be read or written.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from filelock import FileLock, Timeout

LOCK_SECONDS = 10.0  # the longest a writer waits for another process's write
STALE_SECONDS = 3600  # a temporary file this old was left by a process that ended mid-write


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} where it is missing or cannot be read now, and {} (the damaged file set aside)
    where it is not a JSON object."""
    data = _read(path)
    return {} if data is None else data


def _read(path: Path) -> dict[str, Any] | None:
    """read_json's, but None where the file is there and cannot be read now (no file handles left, no permission,
    an I/O error): not damaged, and not to be written over."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        return _set_aside(path)
    except OSError:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return _set_aside(path)
    return data if isinstance(data, dict) else _set_aside(path)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A unique temporary path beside `path` to write (by name), moved onto `path` when the block ends without an
    error (removed otherwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sweep(folder: Path) -> None:
    """Remove the temporary files (atomic_path's) that processes which ended mid-write left in `folder`."""
    with contextlib.suppress(OSError):
        for tmp in folder.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < time.time() - STALE_SECONDS:
                    tmp.unlink()


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A file opened for writing ("w" or "wb") under a unique temporary name beside `path`, moved onto `path`
    when the block ends without an error (removed otherwise)."""
    with atomic_path(path) as tmp, open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
        yield f


def locked(path: Path, timeout: float = LOCK_SECONDS) -> FileLock:
    """The cross-process lock of `path` (a `.lock` file beside it); raises filelock.Timeout after `timeout` s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(f"{path}.lock", timeout=timeout)


def write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON, atomically."""
    with atomic_file(path) as f:
        json.dump(data, f, indent=1, ensure_ascii=False)


def update_json(path: Path, change: Callable[[dict[str, Any]], None]) -> bool:
    """Apply `change` to the JSON object in `path` under the file's lock and write it back; False (and a
    one-line note on stderr) where the file could not be written, which never fails the caller."""
    try:
        with locked(path):
            data = _read(path)
            if data is None:  # there but unreadable now: its entries are kept, this change is not
                print(f"localspec: could not read {path}; it is left as it is", file=sys.stderr)
                return False
            change(data)
            write_json(path, data)
        return True
    except (OSError, Timeout) as e:
        print(f"localspec: could not write {path} ({e}); it is rebuilt next time", file=sys.stderr)
        return False


def set_aside(path: Path) -> None:
    """Move a damaged `path` aside as `NAME.damaged` (a one-line note on stderr), so it is rebuilt."""
    with contextlib.suppress(OSError):
        os.replace(path, path.with_name(path.name + ".damaged"))
        print(f"localspec: {path} was damaged; set aside as {path.name}.damaged and rebuilt", file=sys.stderr)


def _set_aside(path: Path) -> dict[str, Any]:
    set_aside(path)
    return {}
