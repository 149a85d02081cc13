"""Pure rules of the lease client: validation, owner ids, renewal timing.

No I/O here; the clock is an argument. Times are seconds of a monotonic clock.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass

from .errors import InvalidArgument

RESOURCE_PATTERN = re.compile(r"[A-Za-z0-9._:/@-]{1,200}")
MAX_OWNER_LENGTH = 200
MIN_TTL_SECONDS = 0.05
MAX_TTL_SECONDS = 7 * 24 * 3600.0

#: renew this often, as a fraction of the ttl
DEFAULT_RENEW_FRACTION = 1 / 3
#: give up this long before the server-side expiry, as a fraction of the ttl
DEFAULT_MARGIN_FRACTION = 0.2
#: after a failed renewal (not a refusal), try again this soon, as a fraction of the ttl
DEFAULT_RETRY_FRACTION = 1 / 20


def check_resource(resource: str) -> str:
    """The resource, or InvalidArgument if it breaks the contract's alphabet."""
    if not isinstance(resource, str) or not RESOURCE_PATTERN.fullmatch(resource):
        raise InvalidArgument(
            "resource must be 1 to 200 characters of A-Z a-z 0-9 . _ : / @ -"
        )
    return resource


def check_owner(owner: str) -> str:
    if not isinstance(owner, str) or not 1 <= len(owner) <= MAX_OWNER_LENGTH:
        raise InvalidArgument(f"owner must be 1 to {MAX_OWNER_LENGTH} characters")
    if any(ch in owner for ch in "\r\n\x00"):
        raise InvalidArgument("owner must not contain CR, LF or NUL")
    return owner


def check_ttl(ttl: float) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise InvalidArgument("ttl must be a number of seconds")
    if not MIN_TTL_SECONDS <= ttl <= MAX_TTL_SECONDS:
        raise InvalidArgument(
            f"ttl must be between {MIN_TTL_SECONDS} and {MAX_TTL_SECONDS:.0f} seconds"
        )
    return float(ttl)


def check_fence(fence: int) -> int:
    if isinstance(fence, bool) or not isinstance(fence, int) or not 0 < fence < 2**63:
        raise InvalidArgument("fence must be a positive 64-bit integer")
    return fence


_owner_cache: dict[int, str] = {}


def default_owner() -> str:
    """A unique owner id for this process: host, pid and a random part."""
    pid = os.getpid()
    if pid not in _owner_cache:  # a forked child gets its own
        host = socket.gethostname()[:100] or "host"
        _owner_cache[pid] = f"{host}:{pid}:{secrets.token_hex(4)}"
    return _owner_cache[pid]


@dataclass(frozen=True)
class RenewalPolicy:
    """When to renew a lease of ``ttl`` seconds, and when to stop trusting it.

    The local deadline is measured from the moment the claim or renewal was
    *sent*: the server started its ttl no earlier than that, so the local
    deadline always falls before the server-side expiry, by at least the margin.
    """

    ttl: float
    renew_fraction: float = DEFAULT_RENEW_FRACTION
    margin_fraction: float = DEFAULT_MARGIN_FRACTION
    retry_fraction: float = DEFAULT_RETRY_FRACTION

    def __post_init__(self) -> None:
        check_ttl(self.ttl)
        if not 0 < self.margin_fraction < 1:
            raise InvalidArgument("margin_fraction must be between 0 and 1")
        if not 0 < self.renew_fraction < 1 - self.margin_fraction:
            raise InvalidArgument("renew_fraction must leave room before the margin")
        if not 0 < self.retry_fraction <= self.renew_fraction:
            raise InvalidArgument("retry_fraction must be positive and at most renew_fraction")

    @property
    def interval(self) -> float:
        """Seconds between renewals: ``ttl * renew_fraction``."""
        return self.ttl * self.renew_fraction

    @property
    def margin(self) -> float:
        """The safety margin, in seconds, by which the holder gives up before
        the server-side expiry: ``ttl * margin_fraction``."""
        return self.ttl * self.margin_fraction

    def deadline(self, sent_at: float) -> float:
        """The last moment the holder may act on a lease confirmed by a request
        sent at ``sent_at``."""
        return sent_at + self.ttl - self.margin

    def next_renewal(self, sent_at: float) -> float:
        """When to renew after a successful request sent at ``sent_at``."""
        return sent_at + self.interval

    def retry_at(self, now: float, deadline: float) -> float:
        """When to try again after a renewal that failed without an answer."""
        return min(now + self.ttl * self.retry_fraction, deadline)
