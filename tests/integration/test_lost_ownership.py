"""Lease rule 6: a holder that cannot prove ownership stops at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from prometheus_client import REGISTRY

from leases import Lease, LeaseClient, LeaseLost, clock
from tests.support.faultproxy import FaultProxy
from tests.support.lapse import lapse
from tests.support.pause import pause_until_taken
from tests.support.waiting import until

TTL = 1.5
#: a ttl whose renewals (every 2 s) come long before its deadline (4.8 s):
#: the takeover is seen by a renewal, whatever the machine's load
TAKEOVER_TTL = 6.0


async def _guarded_until_cancelled(lease: Lease, steps: list[float]) -> str:
    """Run a guarded block that would work forever, recording when each
    step began (``leases.clock``); the reason the lease was lost."""
    with pytest.raises(LeaseLost) as lost:
        async with lease:
            while True:
                await asyncio.sleep(0.01)
                steps.append(clock.now())
    return lost.value.reason


async def test_a_takeover_cancels_the_guarded_block_within_one_renewal(
    pool: asyncpg.Pool,
) -> None:
    """The first renewal after the takeover is refused, and that refusal
    (not the local deadline, which would say "expired" or "unreachable")
    cancels the block."""
    a, b = LeaseClient(pool=pool, owner="a"), LeaseClient(pool=pool, owner="b")
    lease = await a.claim("run:1", ttl=TAKEOVER_TTL)
    assert lease is not None
    steps: list[float] = []
    block = asyncio.create_task(_guarded_until_cancelled(lease, steps))
    await until(lambda: bool(steps), "the guarded block at work")
    lost_before = renewals("lost")
    # the lease dies server-side (as if a renewal had been lost) and b takes over
    await lapse(pool)
    assert await b.claim("run:1", ttl=30) is not None
    assert await block == "taken"
    assert renewals("lost") == lost_before + 1  # one renewal, refused, and no other
    assert steps[-1] < lease.deadline


async def test_a_paused_holder_is_cancelled_the_moment_it_wakes(dsn: str) -> None:
    """The zombie: the whole process freezes past its ttl while another owner
    claims. On waking, the guarded block must not run another step."""
    async with LeaseClient(dsn, owner="a") as a:
        lease = await a.claim("run:1", ttl=0.5)
        assert lease is not None
        steps_after_pause: list[str] = []
        with pytest.raises(LeaseLost) as lost:
            async with lease:
                # a stop-the-world pause: nothing in this loop runs until b has claimed
                fence_b = pause_until_taken(dsn, "run:1")
                await asyncio.sleep(0)  # the first await after waking
                steps_after_pause.append("acted")  # the zombie's "one last step"
        assert fence_b > lease.fence
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
        steps: list[float] = []
        block = asyncio.create_task(_guarded_until_cancelled(lease, steps))
        await until(lambda: bool(steps), "the guarded block at work")
        proxy.set_mode(fault)  # type: ignore[arg-type]
        assert await block == "unreachable"
        # cancelled at the local deadline, which is the margin before the
        # server-side expiry: no step after it but the one already due
        # (leases/lease.py), however late a busy loop noticed
        late = [t for t in steps if t >= lease.deadline]
        assert len(late) <= 1, f"{len(late)} steps of the block ran past its deadline"
        # and the server still considered the lease ours at that moment
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
    """A block that runs for more than its ttl keeps the lease: four renewals
    (four seconds of a 3 s ttl), and the other owner loses after each."""
    a, b = LeaseClient(pool=pool, owner="a"), LeaseClient(pool=pool, owner="b")
    ok_before = renewals("ok")
    # renewals every second; lost only after a stall of 1.4 s
    lease = await a.claim("run:1", ttl=3.0)
    assert lease is not None
    async with lease:
        for n in range(4):
            seen = lease.expires_at
            await until(lambda seen=seen: lease.expires_at > seen,  # type: ignore[misc]
                        f"renewal {n + 1}")
            assert await b.claim("run:1", ttl=30) is None
        lease.check()
    assert renewals("ok") >= ok_before + 4
