"""Streaming text out of tokens: incremental UTF-8 decoding and stop strings that never print."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Feed token bytes, get back the text that is safe to show now.

    Text that could still turn into a stop string is held back; once a stop string appears,
    `stopped` is set and nothing from the stop string on is ever returned.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = [s for s in stops if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.text = ""  # everything decoded so far (cut at a stop string once found)
        self.shown = 0  # how much of self.text has been returned
        self.stopped = False
        self.matched: str | None = None  # the stop string found (the first in the text)

    def feed(self, data: bytes, final: bool = False) -> str:
        """Add bytes; return newly showable text."""
        if self.stopped:
            return ""
        start = len(self.text)
        self.text += self._decoder.decode(data, final)
        hits = [(i, s) for s in self.stops if (i := self.text.find(s, max(0, start - len(s) + 1))) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            self.text, self.stopped = self.text[:at], True
            return self._show(len(self.text))
        return self._show(len(self.text) if final else len(self.text) - self._held())

    def _held(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        for n in range(min(len(self.text), max(map(len, self.stops), default=1) - 1), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def _show(self, upto: int) -> str:
        out = self.text[self.shown : upto]
        self.shown = max(self.shown, upto)
        return out
