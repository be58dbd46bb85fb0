"""Responses kept for `previous_response_id` (the Responses API's `store`, true unless a request says false): each
response as it was answered and the conversation that led to it, a file each, so a server restarted between two
turns goes on. The target's KV state of that conversation comes back from the prompt cache (its disk tier), which
keeps every prefix it has decoded.

Bounded: the MAX_STORED newest are kept, the oldest removed as new ones come. A damaged file is set aside with
one line (files.read_json) and its response is gone; nothing raises on a store that cannot be read or written."""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path
from typing import Any

from localspec.files import atomic_file, read_json

MAX_STORED = 1000
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{24}")  # what ResponsesShape makes: nothing else names a file


class ResponseStore:
    """The stored responses, a JSON file each under `root`, written on a thread of their own (a conversation's
    history serialized, the oldest files found and removed: off the event loop); a response waiting to be
    written is read from memory, so a next turn that names it at once finds it."""

    def __init__(self, root: Path, limit: int = MAX_STORED) -> None:
        self.root, self.limit = root, limit
        self._pending: dict[str, dict[str, Any]] = {}  # by id, until its file is written
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None

    def _path(self, rid: str) -> Path | None:
        return self.root / f"{rid}.json" if RESPONSE_ID.fullmatch(rid) else None

    def get(self, rid: str) -> dict[str, Any] | None:
        """{"response": the response object, "history": the conversation through its answer, as the chat template
        reads it (its system message left out)}; None where none is stored under `rid`."""
        with self._lock:
            if (pending := self._pending.get(rid)) is not None:
                return pending
        path = self._path(rid)
        kept = read_json(path) if path is not None else {}
        if not isinstance(kept.get("response"), dict) or not isinstance(kept.get("history"), list):
            return None
        return kept

    def put(self, rid: str, response: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """Keep a response and its conversation (written on the store's thread); the oldest beyond the limit go."""
        if self._path(rid) is None:
            return
        with self._lock:
            self._pending[rid] = {"response": response, "history": history}
            if self._writer is None:  # not a daemon: a server stopping writes what it answered
                self._writer = threading.Thread(target=self._write_all, name="localspec-responses")
                self._writer.start()

    def _write_all(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._writer = None
                    return
                rid, kept = next(iter(self._pending.items()))
            self._write(rid, kept)
            with self._lock:
                if self._pending.get(rid) is kept:
                    del self._pending[rid]

    def _write(self, rid: str, kept: dict[str, Any]) -> None:
        path = self._path(rid)
        assert path is not None
        try:
            with atomic_file(path) as f:
                json.dump(kept, f)
            stored = sorted(self.root.glob("resp_*.json"), key=lambda p: p.stat().st_mtime_ns)
            for old in stored[: max(0, len(stored) - self.limit)]:
                old.unlink(missing_ok=True)
        except OSError as e:  # a full or read-only disk: the answer stands, it is not kept
            print(f"localspec: response {rid} not stored ({e})", file=sys.stderr)

    def flush(self) -> None:
        """Wait for the responses waiting to be written."""
        writer = self._writer
        if writer is not None:
            writer.join()

    def delete(self, rid: str) -> bool:
        """Remove a stored response: whether one was there."""
        with self._lock:
            waiting = self._pending.pop(rid, None) is not None
        self.flush()  # one being written now is on disk after this
        path = self._path(rid)
        if path is None or not path.exists():
            return waiting
        path.unlink(missing_ok=True)
        return True
