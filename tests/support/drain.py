"""What the drain-barrier tests share: a gateway's short timeouts, the slow
link's rate, and a second worker claiming as soon as the barrier lets it."""

from __future__ import annotations

import asyncpg

from leases import Lease, LeaseClient
from tests.support.lapse import lapse
from tests.support.waiting import until

RATE = 64_000  # bytes a second: the body needs over 6 s, the attempt has 2
#: server settings that keep an attempt's budget and the barrier's grace short
FAST = {"database_timeout_seconds": 1, "barrier_grace_seconds": 0.5,
        "max_body_bytes": 1024 * 1024}
#: the same, as the [server] keys of a configuration file
FAST_TOML = "\n".join(f"{key} = {value}" for key, value in FAST.items())


async def claim_after_barrier(pool: asyncpg.Pool, resource: str,
                              owner: str = "worker-b") -> Lease:
    """Let the lease on ``resource`` run out now (its holder stalled, or
    died), then claim it as ``owner`` as soon as its drain barrier lets a
    claim win: fence F+1."""
    await lapse(pool, resource)
    b = LeaseClient(pool=pool, owner=owner)
    won: list[Lease] = []

    async def claimed() -> bool:
        lease = await b.claim(resource, ttl=30)
        if lease is not None:
            won.append(lease)
        return lease is not None

    await until(claimed, f"{owner}'s claim of {resource} once its drain barrier opens")
    return won[0]
