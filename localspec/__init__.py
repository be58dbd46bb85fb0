"""localspec: lossless speculative decoding for local GGUF models.

The public API is `LocalSpec` (load a pair once, generate from prompts or chat messages) and the
`Generation` it returns; see localspec.api.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localspec import process  # noqa: F401  (first: the process's own clock starts before the heavy imports)

__version__ = "0.1.0"
__all__ = ["Generation", "LocalSpec", "Piece", "Stats", "__version__"]

if TYPE_CHECKING:
    from localspec.api import Generation, LocalSpec
    from localspec.core.stats import Piece, Stats


def __getattr__(name: str) -> Any:
    """Import the API on first use: `localspec --help` need not load llama.cpp."""
    if name in ("LocalSpec", "Generation"):
        from localspec import api

        return getattr(api, name)
    if name in ("Piece", "Stats"):
        from localspec.core import stats

        return getattr(stats, name)
    raise AttributeError(f"module 'localspec' has no attribute {name!r}")
