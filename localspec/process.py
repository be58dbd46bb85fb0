"""When this process started, on the clock its figures are measured by (time.perf_counter, which a suspended
machine's sleep does not advance). Imported first by the package, so that its own import time is known."""

from __future__ import annotations

import os
import time

MAX_STARTUP = 10.0  # seconds from the process's start to localspec's import that are believed (a cold start)


def _slept() -> float:
    """How long the machine has been suspended since it booted (0 where the clocks to tell are missing)."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)
    except (AttributeError, OSError):
        return 0.0


IMPORTED = time.perf_counter()  # when localspec was first imported
_SLEPT = _slept()


def _age() -> float:
    """This process's age on the boot clock (Linux: /proc/self/stat's start time); OSError elsewhere."""
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks after boot
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


def started() -> float:
    """The perf_counter() reading when this process started: what a user waits for starts there (the
    interpreter's start and the imports count too). Its age on the boot clock, less the machine's sleep since
    localspec was imported; where that cannot be told or reads wrong (a sleep before the import, a sandbox whose
    clocks disagree), when localspec was imported."""
    try:
        age = _age() - (_slept() - _SLEPT)
    except (OSError, ValueError, IndexError, AttributeError):
        return IMPORTED
    now = time.perf_counter()
    before_import = age - (now - IMPORTED)
    return now - age if 0 <= before_import <= MAX_STARTUP else IMPORTED
