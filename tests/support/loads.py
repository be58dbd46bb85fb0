"""A draft model's load beside the target, as tests wait for it and look for its thread."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any


def joined_once_loaded(run: Iterable[Any], drafter: Any) -> None:
    """Run a generation to its end; where its draft model is loading beside it, wait for that load once (the
    target goes on alone meanwhile), so it joins within the answer however fast this machine loads it."""
    for _ in run:
        if drafter.loading is not None:
            drafter.loading.result()


def load_threads() -> list[threading.Thread]:
    """The draft-model load threads alive now."""
    return [t for t in threading.enumerate() if t.name == "localspec-draft-load"]
