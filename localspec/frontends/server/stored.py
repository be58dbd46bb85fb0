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
from pathlib import Path
from typing import Any

from localspec.files import atomic_file, read_json

MAX_STORED = 1000
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{24}")  # what ResponsesShape makes: nothing else names a file


class ResponseStore:
    """The stored responses, a JSON file each under `root`."""

    def __init__(self, root: Path, limit: int = MAX_STORED) -> None:
        self.root, self.limit = root, limit

    def _path(self, rid: str) -> Path | None:
        return self.root / f"{rid}.json" if RESPONSE_ID.fullmatch(rid) else None

    def get(self, rid: str) -> dict[str, Any] | None:
        """{"response": the response object, "history": the conversation through its answer, as the chat template
        reads it (its system message left out)}; None where none is stored under `rid`."""
        path = self._path(rid)
        kept = read_json(path) if path is not None else {}
        if not isinstance(kept.get("response"), dict) or not isinstance(kept.get("history"), list):
            return None
        return kept

    def put(self, rid: str, response: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """Keep a response and its conversation; the oldest beyond the limit go."""
        path = self._path(rid)
        if path is None:
            return
        try:
            with atomic_file(path) as f:
                json.dump({"response": response, "history": history}, f)
            stored = sorted(self.root.glob("resp_*.json"), key=lambda p: p.stat().st_mtime_ns)
            for old in stored[: max(0, len(stored) - self.limit)]:
                old.unlink(missing_ok=True)
        except OSError as e:  # a full or read-only disk: the answer stands, it is not kept
            print(f"localspec: response {rid} not stored ({e})", file=sys.stderr)

    def delete(self, rid: str) -> bool:
        """Remove a stored response: whether one was there."""
        path = self._path(rid)
        if path is None or not path.exists():
            return False
        path.unlink(missing_ok=True)
        return True
