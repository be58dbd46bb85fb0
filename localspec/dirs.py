"""The user's directories for localspec (XDG locations, overridable by the usual variables)."""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback) / "localspec"


def data_dir() -> Path:
    """Chat history and saved conversations."""
    return _xdg("XDG_DATA_HOME", ".local/share")


def cache_dir() -> Path:
    """Downloaded model chunk wheels."""
    return _xdg("XDG_CACHE_HOME", ".cache")
