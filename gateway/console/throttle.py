"""The console's login throttle: failed logins, per source address and
overall, in a sliding window. Pure: the clock is an argument (the handler
reads ``LoginThrottle.clock``, which a test may replace).

    a source's last PER_SOURCE_FAILURES failures within WINDOW_SECONDS
        → that source's logins refused 429 until the oldest leaves the window
    OVERALL_FAILURES failures within WINDOW_SECONDS, from anywhere
        → every login refused 429 until the oldest leaves the window

A refused login is not checked at all (a right key is refused too, so the
throttle is no oracle). A success clears its source's failures, not the
overall count. What it remembers is bounded: at most OVERALL_FAILURES
failures, so at most that many sources.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

#: failures one source address may make within the window
PER_SOURCE_FAILURES = 10
#: failures all sources together may make within the window
OVERALL_FAILURES = 100
WINDOW_SECONDS = 300.0


@dataclass
class LoginThrottle:
    per_source: int = PER_SOURCE_FAILURES
    overall_limit: int = OVERALL_FAILURES
    window: float = WINDOW_SECONDS
    #: the clock the handler passes in (monotonic seconds)
    clock: Callable[[], float] = time.monotonic
    sources: dict[str, deque[float]] = field(default_factory=dict)
    overall: deque[float] = field(default_factory=deque)

    def _forget(self, now: float) -> None:
        cutoff = now - self.window
        while self.overall and self.overall[0] <= cutoff:
            self.overall.popleft()
        for source in [s for s, seen in self.sources.items() if seen[-1] <= cutoff]:
            del self.sources[source]

    def wait(self, source: str, now: float) -> float:
        """Seconds until a login from ``source`` is looked at again (0: now)."""
        self._forget(now)
        waits = [0.0]
        seen = self.sources.get(source)
        if seen is not None and len(seen) >= self.per_source:
            waits.append(seen[-self.per_source] + self.window - now)
        if len(self.overall) >= self.overall_limit:
            waits.append(self.overall[-self.overall_limit] + self.window - now)
        return max(waits)

    def failed(self, source: str, now: float) -> int:
        """Count a failed login from ``source``; its failures in the window."""
        self._forget(now)
        seen = self.sources.setdefault(source, deque(maxlen=self.per_source))
        seen.append(now)
        self.overall.append(now)
        while len(self.overall) > self.overall_limit:
            self.overall.popleft()
        return len(seen)

    def succeeded(self, source: str) -> None:
        self.sources.pop(source, None)


THROTTLE_KEY = web.AppKey("console_login_throttle", LoginThrottle)
