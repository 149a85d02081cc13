"""The one local clock fencegate trusts for deadlines.

A lease's local deadline must keep running while the machine sleeps: a
laptop lid closed for an hour is an hour without renewals. On Linux
``time.monotonic()`` (CLOCK_MONOTONIC) stops during suspend; CLOCK_BOOTTIME
does not, so it is used where the platform has it. Elsewhere the monotonic
clock is the best there is.

Only durations on this one machine are measured with it; it is never
compared with another process's clock or the database's.
"""

from __future__ import annotations

import time

_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


def _boottime() -> float:
    assert _BOOTTIME is not None
    return time.clock_gettime(_BOOTTIME)


#: seconds on a clock that never goes back and counts system suspend
now = _boottime if _BOOTTIME is not None else time.monotonic

#: whether ``now`` counts the time the system was suspended
COUNTS_SUSPEND = _BOOTTIME is not None
