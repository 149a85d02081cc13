"""An attempt's local deadline: the moment after which the gateway no longer
acts for it. Pure: the clock is an argument (``leases.clock.now`` by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from leases import clock

#: no send starts closer than this to the deadline: what is left would hardly
#: fit a provider's answer, and a pause right after the check must still fall
#: inside the database's barrier (docs/gateway.md, "the one assumption")
SEND_MARGIN_SECONDS = 0.25


@dataclass(frozen=True)
class Deadline:
    at: float  #: seconds on ``clock``
    clock: Callable[[], float] = field(default=clock.now, compare=False)

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - self.clock()

    def can_start(self, margin: float = SEND_MARGIN_SECONDS) -> bool:
        """Whether a send may still begin now."""
        return self.remaining() > margin

    def bound(self, limit: float) -> float:
        """``limit`` seconds, or fewer if the deadline comes first (never below 0)."""
        return max(0.0, min(limit, self.remaining()))
