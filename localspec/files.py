"""JSON files that several localspec processes share: read whole or not at all, written atomically under a lock.

A writer takes the file's lock (a `.lock` beside it, filelock), reads the current contents, changes them and
replaces the file with a complete new one written under a unique temporary name: two processes never
lose each other's entries, and a reader never sees half a file. A damaged file (not JSON, or not the shape
its reader expects) is set aside as `NAME.damaged` and its contents start afresh; nothing raises on a
cache that cannot be read or written.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

LOCK_SECONDS = 10.0  # the longest a writer waits for another process's write


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} where it is missing, and {} (the damaged file set aside) where unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError):
        return _set_aside(path)
    try:
        data = json.loads(text)
    except ValueError:
        return _set_aside(path)
    return data if isinstance(data, dict) else _set_aside(path)


def write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON, atomically (a unique temporary file in the same folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, ensure_ascii=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def update_json(path: Path, change: Callable[[dict[str, Any]], None]) -> bool:
    """Apply `change` to the JSON object in `path` under the file's lock and write it back; False (and a
    one-line note on stderr) where the file could not be written, which never fails the caller."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock", timeout=LOCK_SECONDS):
            data = read_json(path)
            change(data)
            write_json(path, data)
        return True
    except (OSError, Timeout) as e:
        print(f"localspec: could not write {path} ({e}); it is rebuilt next time", file=sys.stderr)
        return False


def _set_aside(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError):
        os.replace(path, path.with_name(path.name + ".damaged"))
        print(f"localspec: {path} was damaged; set aside as {path.name}.damaged and rebuilt", file=sys.stderr)
    return {}
