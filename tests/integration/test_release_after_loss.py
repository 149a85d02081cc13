"""A lost lease is released as its block ends even when the pool is busy: the
release retries a ``Busy`` wait for a connection, so a renewal that lands
late does not keep the lease a whole ttl for a holder that gave up
(docs/leases.md)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import REGISTRY

from leases import LeaseClient, LeaseLost, database
from tests.support.faultproxy import FaultProxy
from tests.support.waiting import until

TTL = 5.0  # renewals every 1.67 s; the holder gives up 4 s after its last one was sent


def _busy() -> float:
    return REGISTRY.get_sample_value("fencegate_db_pool_busy_total") or 0.0


async def test_a_lost_lease_is_released_though_the_pool_is_busy(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    proxy = await FaultProxy(dsn).start()
    shared = await database.create_pool(proxy.dsn(), min_size=2, max_size=2,
                                        command_timeout=30)
    client = LeaseClient(pool=shared, acquire_timeout=0.1)
    other_work = await shared.acquire()  # another task of the process holds one connection
    try:
        warm = await client.claim("run:warm", TTL)  # statements prepared on the connection
        assert warm is not None and await warm.renew() is None and await warm.release()
        lease = await client.claim("run:held", TTL)
        assert lease is not None

        granted = await pool.fetchval(
            "SELECT expires_at FROM fencegate_leases WHERE resource = 'run:held'")

        async def landed() -> bool:
            # past the claim's own expiry (not "expires_at - claimed_at > ttl":
            # the claim reads the clock twice, so that is true from the start)
            return bool(await pool.fetchval(
                "SELECT expires_at > $1 FROM fencegate_leases WHERE resource = 'run:held'",
                granted))

        async def stretch_once_landed() -> object:
            await until(landed, "the renewal landing (or the test proves nothing)")
            # as if the late renewal had asked for an hour: only a release ends it
            return await pool.fetchval(
                "UPDATE fencegate_leases SET expires_at = expires_at + interval '1 hour' "
                "WHERE resource = 'run:held' RETURNING expires_at")

        stretched = asyncio.create_task(stretch_once_landed())
        busy_before = _busy()
        with pytest.raises(LeaseLost) as lost:
            async with lease:
                # the renewal at 1.67 s lands and commits; its answer never
                # comes, and its connection stays taken: the pool is full
                proxy.set_mode("lose_replies")
                await asyncio.sleep(3600)
        assert lost.value.reason == "unreachable"
        extended = await stretched
        # the release after the loss is refused Busy: nothing comes free ...
        await until(lambda: _busy() > busy_before, "a release refused Busy")
        # ... until the renewal's connection is cut, and one comes free
        proxy.set_mode("pass")

        async def released() -> bool:
            # ended now, long before the hour the late renewal stands for
            return bool(await pool.fetchval(
                "SELECT expires_at <= clock_timestamp() AND expires_at < $1 "
                "FROM fencegate_leases WHERE resource = 'run:held'", extended))

        await until(released, "the release of the lost lease (it died of Busy while the "
                    "renewal held a connection, and the late renewal keeps the lease)")
        assert await LeaseClient(pool=pool, owner="next").claim("run:held", 30) is not None
    finally:
        await shared.release(other_work)
        await shared.close()
        await proxy.close()
