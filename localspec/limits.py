"""Valid ranges of the numeric settings, shared by the command-line flags and the chat's /set."""

from __future__ import annotations

import math

# name -> (low, high, low excluded)
LIMITS: dict[str, tuple[float, float, bool]] = {
    "k": (0, 64, False),
    "temperature": (0.0, 10.0, False),
    "top_k": (0, 1_000_000, False),
    "top_p": (0.0, 1.0, True),
    "min_p": (0.0, 1.0, False),
    "max_tokens": (1, 1_000_000, False),
    "seed": (0, 2**32 - 1, False),
    "ctx": (64, 1_048_576, False),
    "threads": (1, 1024, False),
    "gpu_layers": (-1, 100_000, False),
    "repeat": (1, 100, False),
}


def check(name: str, value: float) -> float:
    """Return value if it is finite and inside the limits of `name`, else raise ValueError."""
    lo, hi, lo_open = LIMITS[name]
    if not math.isfinite(value) or value < lo or value > hi or (lo_open and value == lo):
        raise ValueError(f"must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]")
    return value
