"""A provider's pace: how long it asked every caller to wait, and the wait.

A provider's 429 says it did not act and when to come back: ``Retry-After``
(seconds, or an HTTP date), else the reset header its preset names
(``Pace.reset``: seconds from now, or an epoch). The gateway then pauses the
provider for every caller of this process, not only for the one request:

    pause > PACE_WAIT_SECONDS  → refused before admission, 429 rate_limited,
                                 Retry-After: the pause left (nothing reserved)
    0 < pause ≤ PACE_WAIT_SECONDS → waited out, then admitted as usual

Pure: the clocks are arguments (``time.monotonic`` for the pause, the wall
clock only to read an HTTP date or an epoch).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.config.presets import Pace

#: a pause this short (what ``Retry-After: 1`` asks) is waited out inside the
#: request rather than answered 429: a second costs the caller less than a
#: refusal and a retry of its own
PACE_WAIT_SECONDS = 1.0
#: a 429 that says nothing of when to come back pauses the provider this long
PAUSE_WITHOUT_HINT_SECONDS = 1.0
#: the longest pause honoured at once, for every caller of the process. A 429
#: met by one client pauses the provider for all of them (they share its
#: credentials and its quota), so a longer Retry-After (a daily quota's
#: "tomorrow", or a provider's answer to one client's misuse) would let one
#: noisy client silence the provider for the others: past this bound, one
#: request finds out whether the provider takes requests again, and a
#: provider still refusing pauses it again. Longer than any per-second or
#: per-minute window's reset; costs a refused request every 30 s otherwise.
MAX_PAUSE_SECONDS = 30.0


def _seconds(value: str | None) -> float | None:
    """A non-negative decimal number of seconds, or None."""
    if value is None or not value.isascii():  # float() reads other digits too
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def retry_after_seconds(value: str | None, wall_now: float) -> float | None:
    """``Retry-After`` as seconds from now: delay-seconds or an HTTP date
    (RFC 9110 10.2.3); None when absent or unreadable. A date in the past is 0."""
    if value is None:
        return None
    value = value.strip()
    if not value.isascii():  # "²" is a digit to isdigit(), not to float()
        return None
    if value.isdigit():
        return float(value)
    try:  # OverflowError: a year or zone offset past what a datetime holds
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:  # asctime and "-0000" dates come naive: HTTP dates are GMT
            when = when.replace(tzinfo=dt.UTC)
        return max(0.0, when.timestamp() - wall_now)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def requested_pause(headers: Mapping[str, str], pace: Pace, wall_now: float) -> float:
    """How long a provider's 429 asks every caller to wait, in seconds, by
    what its preset says it sends; bounded by ``MAX_PAUSE_SECONDS``."""
    found: float | None = None
    if pace.retry_after:
        found = retry_after_seconds(headers.get("Retry-After"), wall_now)
    if found is None and pace.reset:
        reset = _seconds(headers.get(pace.reset))
        if reset is not None:
            found = reset if pace.reset_unit != "epoch_seconds" else \
                max(0.0, reset - wall_now)
    if found is None:
        found = PAUSE_WITHOUT_HINT_SECONDS
    return min(found, MAX_PAUSE_SECONDS)


@dataclass
class Pauses:
    """Each provider's pause in one gateway process, on the monotonic clock."""

    until: dict[str, float] = field(default_factory=dict)

    def remaining(self, provider: str, now: float) -> float:
        """Seconds the provider is still paused (0: not paused)."""
        return max(0.0, self.until.get(provider, now) - now)

    def pause(self, provider: str, now: float, seconds: float) -> float:
        """Pause the provider ``seconds`` from ``now`` (a pause never gets
        shorter); the seconds of pause this added, for the metric."""
        current = max(now, self.until.get(provider, now))
        end = max(current, now + seconds)
        self.until[provider] = end
        return end - current
