"""Lease rule 6: a holder that cannot prove ownership stops at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from prometheus_client import REGISTRY

from leases import LeaseClient, LeaseLost
from tests.support.faultproxy import FaultProxy
from tests.support.waiting import until

TTL = 1.5
SLACK = 0.25  # event-loop scheduling on a shared 2-core machine


async def _guarded_until_cancelled(lease: object, log: list[str]) -> float:
    """Run a guarded block that would work forever; answer when it was cancelled."""
    cancelled_at = 0.0
    with pytest.raises(LeaseLost) as lost:
        async with lease:  # type: ignore[attr-defined]
            try:
                while True:
                    await asyncio.sleep(0.01)
                    log.append("worked")
            finally:
                cancelled_at = time.monotonic()
    log.append(f"lost:{lost.value.reason}")
    return cancelled_at


async def test_a_takeover_cancels_the_guarded_block_within_one_renewal(
    pool: asyncpg.Pool,
) -> None:
    a, b = LeaseClient(pool=pool, owner="a"), LeaseClient(pool=pool, owner="b")
    lease = await a.claim("run:1", ttl=TTL)
    assert lease is not None
    log: list[str] = []
    block = asyncio.create_task(_guarded_until_cancelled(lease, log))
    await until(lambda: "worked" in log, "the guarded block at work")
    # the lease dies server-side (as if a renewal had been lost) and b takes over
    await pool.execute("UPDATE fencegate_leases SET expires_at = clock_timestamp()")
    assert await b.claim("run:1", ttl=30) is not None
    taken_at = time.monotonic()
    lost_before = renewals("lost")
    cancelled_at = await block
    assert log[-1] == "lost:taken"
    assert renewals("lost") == lost_before + 1
    assert cancelled_at - taken_at <= lease.policy.interval + SLACK


async def test_a_paused_holder_is_cancelled_the_moment_it_wakes(dsn: str) -> None:
    """The zombie: the whole process freezes past its ttl while another owner
    claims. On waking, the guarded block must not run another step."""
    async with LeaseClient(dsn, owner="a") as a:
        lease = await a.claim("run:1", ttl=0.5)
        assert lease is not None
        claimed_by_b: list[int] = []

        def other_worker() -> None:
            async def claim() -> None:
                async with LeaseClient(dsn, owner="b") as b:
                    while True:
                        got = await b.claim("run:1", ttl=30)
                        if got is not None:
                            claimed_by_b.append(got.fence)
                            return
                        await asyncio.sleep(0.05)
            asyncio.run(claim())

        steps_after_pause: list[str] = []
        with pytest.raises(LeaseLost) as lost:
            async with lease:
                thread = threading.Thread(target=other_worker)
                thread.start()
                time.sleep(1.5)  # a stop-the-world pause: nothing in this loop runs
                thread.join()
                await asyncio.sleep(0)  # the first await after waking
                steps_after_pause.append("acted")  # the zombie's "one last step"
        assert claimed_by_b and claimed_by_b[0] > lease.fence
        assert steps_after_pause == []
        assert lost.value.reason == "expired"
        with pytest.raises(LeaseLost):
            lease.check()


@pytest.fixture
async def proxy(dsn: str) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy(dsn).start()
    yield p
    await p.close()


@pytest.mark.parametrize("fault", ["blackhole", "drop"])
async def test_an_unreachable_database_cancels_the_block_before_the_lease_expires(
    proxy: FaultProxy, pool: asyncpg.Pool, fault: str
) -> None:
    async with LeaseClient(proxy.dsn(), owner="a") as a:
        lease = await a.claim("run:1", ttl=TTL)
        assert lease is not None
        log: list[str] = []
        block = asyncio.create_task(_guarded_until_cancelled(lease, log))
        await until(lambda: "worked" in log, "the guarded block at work")
        proxy.set_mode(fault)  # type: ignore[arg-type]
        cut_at = time.monotonic()
        cancelled_at = await block
        assert log[-1] == "lost:unreachable"
        # cancelled no later than the local deadline, which is the margin
        # before the server-side expiry
        assert cancelled_at - cut_at <= TTL - lease.policy.margin + SLACK
        # and the server still considered the lease live at that moment
        info = await LeaseClient(pool=pool).show("run:1")
        assert info is not None and info.fence == lease.fence
        proxy.set_mode("pass")


async def test_a_clean_exit_releases_the_lease(pool: asyncpg.Pool) -> None:
    a, b = LeaseClient(pool=pool, owner="a"), LeaseClient(pool=pool, owner="b")
    lease = await a.claim("run:1", ttl=30)
    assert lease is not None
    async with lease:
        await asyncio.sleep(0.01)
    assert await b.claim("run:1", ttl=30) is not None


def renewals(result: str) -> float:
    return REGISTRY.get_sample_value("fencegate_lease_renewals_total",
                                     {"result": result}) or 0.0


async def test_renewal_keeps_a_long_block_alive(pool: asyncpg.Pool) -> None:
    a, b = LeaseClient(pool=pool, owner="a"), LeaseClient(pool=pool, owner="b")
    ok_before = renewals("ok")
    # a ttl a loaded machine's renewals (every ttl/3) keep up with; each
    # sleep is past a ttl, so a slow machine only makes the check harder
    lease = await a.claim("run:1", ttl=TTL)
    assert lease is not None
    async with lease:
        for _ in range(3):  # three ttls
            await asyncio.sleep(TTL)
            assert await b.claim("run:1", ttl=30) is None
        lease.check()
    assert renewals("ok") >= ok_before + 6  # every ttl/3
