"""Pure rules of the work queue: retry decisions, backoff with jitter, and
sanitising errors before they are stored. The random source is an argument."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .redact import redact

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_SECONDS = 1.0
DEFAULT_BACKOFF_CAP_SECONDS = 3600.0
MAX_ERROR_LENGTH = 2000


@dataclass(frozen=True)
class RetryDecision:
    """What happens to a job after a failed attempt."""

    retry: bool
    delay_seconds: float


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS
    cap_seconds: float = DEFAULT_BACKOFF_CAP_SECONDS

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0 < self.base_seconds <= self.cap_seconds:
            raise ValueError("backoff needs 0 < base_seconds <= cap_seconds")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Delay before attempt ``attempt + 1``: exponential, capped, with the
        upper half jittered (so retries of a burst spread out, but never come
        sooner than half the exponential step)."""
        step = min(self.cap_seconds, self.base_seconds * 2.0 ** min(attempt - 1, 62))
        return step / 2 + rng.uniform(0, step / 2)

    def decide(self, attempt: int, max_attempts: int, rng: random.Random) -> RetryDecision:
        """After failed attempt number ``attempt`` (1-based) of ``max_attempts``."""
        if attempt >= max_attempts:
            return RetryDecision(False, 0.0)
        return RetryDecision(True, self.backoff(attempt, rng))


def sanitize_error(error: BaseException | str) -> str:
    """One bounded line for ``last_error``: the type and message, with
    credentials, tokens and keys blanked (leases/redact.py)."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    text = " ".join(redact(text).split())
    if len(text) > MAX_ERROR_LENGTH:
        text = text[: MAX_ERROR_LENGTH - 1] + "…"
    return text
