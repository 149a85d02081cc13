"""Closing the LeaseClient does not cut short the abandon of a claim whose
answer was lost: the claim is looked for as long as docs/leases.md promises
(30 s), even when ``async with LeaseClient(...)`` closes the client the moment
the claim's ``Unavailable`` leaves the block."""

from __future__ import annotations

import time

import asyncpg
import pytest

from leases import LeaseClient, Unavailable, database
from tests.support.faultproxy import FaultProxy
from tests.support.waiting import until

DELAY = 3.0  # the claim's statement reaches the database this late
TIMEOUT = 0.3


async def test_an_abandon_outlives_the_close_of_its_client(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    proxy = await FaultProxy(dsn, delay_seconds=DELAY).start()
    # as the gateway builds its pool: the command timeout bounds asyncpg's
    # cancel request, so an unanswered cancel drops the connection
    slow = await database.create_pool(proxy.dsn(), min_size=1, max_size=4,
                                      command_timeout=TIMEOUT)
    try:
        client = LeaseClient(pool=slow, timeout=TIMEOUT)
        for i in range(3):  # the claim statement is prepared on the pool's connection
            assert await client.claim(f"run:warm-{i}", 60) is not None
        sent = time.monotonic()
        with pytest.raises(Unavailable):
            async with client:
                proxy.set_mode("delay")
                try:
                    await client.claim("run:orphan", 3600)  # an owner made up for it
                finally:
                    proxy.set_mode("pass")  # the database answers again at once
                    answered = time.monotonic() - sent
        # the claim lands DELAY s after it was sent; the abandon's first look
        # finds nothing and records the owner, so the claim is refused
        # whenever it lands: one answer settles it
        await until(lambda: pool.fetchval("SELECT count(*) > 0 FROM fencegate_abandoned_owners"),
                    f"the abandon's answer (the client's Unavailable came {answered:.1f} s "
                    f"after the claim was sent; close() cancelled the abandon)")
        row = await pool.fetchrow("SELECT owner, fence, expires_at > clock_timestamp() AS live"
                                  " FROM fencegate_leases WHERE resource = 'run:orphan'")
        # refused, or ended by the abandon: with no lease before it, no row at
        # all (tests/integration/test_abandoned_claims.py holds both orders open)
        assert row is None or not row["live"], dict(row)
        lease = await LeaseClient(pool=pool, owner="next").claim("run:orphan", 30)
        assert lease is not None, f"run:orphan is held for an hour by {row and row['owner']!r}"
    finally:
        await slow.close()
        await proxy.close()
