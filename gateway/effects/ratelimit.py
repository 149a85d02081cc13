"""A token bucket per provider. Pure: the clock is an argument."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """``rate`` tokens a second, bursts up to ``burst``."""

    rate: float
    burst: float
    tokens: float = field(init=False)
    updated: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self, now: float) -> float:
        """Take one token. Answers 0 when taken, else the seconds until one is due."""
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` in whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
