"""A lost lease is released as its block ends even when the pool is busy: the
release retries a ``Busy`` wait for a connection, so a renewal that lands
late does not keep the lease a whole ttl for a holder that gave up
(docs/leases.md)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from leases import LeaseClient, LeaseLost, database
from tests.support.faultproxy import FaultProxy

TTL = 5.0  # renewals every 1.67 s; the holder gives up 4 s after its last one was sent
DELAY = 1.5  # each way: the renewal lands 1.5 s after it is sent, its answer 1.5 s later


async def test_a_lost_lease_is_released_though_the_pool_is_busy(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    proxy = await FaultProxy(dsn, delay_seconds=DELAY).start()
    shared = await database.create_pool(proxy.dsn(), min_size=2, max_size=2,
                                        command_timeout=30)
    client = LeaseClient(pool=shared, acquire_timeout=0.1)
    other_work = await shared.acquire()  # another task of the process holds one connection
    try:
        warm = await client.claim("run:warm", TTL)  # statements prepared on the connection
        assert warm is not None and await warm.renew() is None and await warm.release()
        sent = time.monotonic()
        lease = await client.claim("run:held", TTL)
        assert lease is not None
        with pytest.raises(LeaseLost) as lost:
            async with lease:
                await asyncio.sleep(1.0)
                proxy.set_mode("delay")  # the renewal at 1.67 s lands at 3.2 s, answers at 4.7 s
                await asyncio.sleep(60)
        proxy.set_mode("pass")
        assert lost.value.reason == "unreachable"
        row = await pool.fetchrow(
            "SELECT extract(epoch FROM expires_at - claimed_at)::float8 AS held_for, "
            "expires_at > clock_timestamp() AS live FROM fencegate_leases "
            "WHERE resource = 'run:held'")
        assert row["live"] and row["held_for"] > TTL + 1, \
            "the renewal did not land after all: the test proves nothing"
        nxt = LeaseClient(pool=pool, owner="next")
        got = None
        while got is None and time.monotonic() - sent < 7.0:  # the late renewal ends at ~8.2 s
            got = await nxt.claim("run:held", 30)
            await asyncio.sleep(0.1)
        assert got is not None, (
            f"the lease the holder gave up {time.monotonic() - sent - 4.0:.1f} s ago is still "
            f"held (the late renewal kept it to {row['held_for']:.1f} s after the claim): the "
            f"release after the loss died of Busy while the renewal held a connection")
    finally:
        await shared.release(other_work)
        await shared.close()
        await proxy.close()
