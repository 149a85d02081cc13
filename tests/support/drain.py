"""What the drain-barrier tests share: a gateway's short timeouts, the slow
link's rate, and a second worker claiming as soon as the barrier lets it."""

from __future__ import annotations

import asyncio

from leases import LeaseClient

RATE = 64_000  # bytes a second: the body needs over 6 s, the attempt has 2
#: server settings that keep an attempt's budget and the barrier's grace short
FAST = {"database_timeout_seconds": 1, "barrier_grace_seconds": 0.5,
        "max_body_bytes": 1024 * 1024}


async def claim_after_barrier(b: LeaseClient, resource: str) -> None:
    """Claim ``resource`` as soon as its drain barrier lets a claim win."""
    while await b.claim(resource, ttl=30) is None:
        await asyncio.sleep(0.02)
