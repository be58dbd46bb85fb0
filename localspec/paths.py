"""The user's directories for localspec, by the platform's conventions (platformdirs).

On Linux these honour XDG_DATA_HOME and XDG_CACHE_HOME; LOCALSPEC_DATA_DIR and LOCALSPEC_CACHE_DIR
override both (the tests point them at temporary folders).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    """Chat history, saved conversations and (outside a source checkout) the models."""
    env = os.environ.get("LOCALSPEC_DATA_DIR")
    return Path(env).expanduser() if env else Path(platformdirs.user_data_dir("localspec", appauthor=False))


def cache_dir() -> Path:
    """Downloaded model chunk wheels and the measured decode costs."""
    env = os.environ.get("LOCALSPEC_CACHE_DIR")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("localspec", appauthor=False))
