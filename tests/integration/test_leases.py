"""Lease rules 1-4 on a real PostgreSQL."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from leases import InvalidArgument, LeaseClient
from tests.support.lapse import lapse


async def test_claim_issues_a_fence_and_a_second_owner_loses_silently(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = LeaseClient(pool=pool, owner="a"), LeaseClient(pool=pool, owner="b")
    lease = await a.claim("run:1", ttl=30)
    assert lease is not None and lease.owner == "a" and lease.fence > 0
    assert await b.claim("run:1", ttl=30) is None
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


async def test_same_owner_may_claim_again_and_gets_a_higher_fence(pool: asyncpg.Pool) -> None:
    a = LeaseClient(pool=pool, owner="a")
    first = await a.claim("run:1", ttl=30)
    second = await a.claim("run:1", ttl=30)
    assert first is not None and second is not None
    assert second.fence > first.fence


async def test_renew_needs_the_right_owner_and_fence_and_a_live_lease(pool: asyncpg.Pool) -> None:
    a = LeaseClient(pool=pool, owner="a")
    lease = await a.claim("run:1", ttl=30)
    assert lease is not None
    assert await a.renew("run:1", "a", lease.fence, 30) is not None
    assert await a.renew("run:1", "b", lease.fence, 30) is None
    assert await a.renew("run:1", "a", lease.fence - 1, 30) is None
    assert await a.renew("run:1", "a", lease.fence + 1, 30) is None

    short = await a.claim("run:2", ttl=0.2)
    assert short is not None
    await asyncio.sleep(0.3)
    assert await a.renew("run:2", "a", short.fence, 30) is None


async def test_renewal_after_a_takeover_fails(pool: asyncpg.Pool) -> None:
    a, b = LeaseClient(pool=pool, owner="a"), LeaseClient(pool=pool, owner="b")
    old = await a.claim("run:1", ttl=30)
    assert old is not None
    await lapse(pool)  # a stalled past its ttl
    new = await b.claim("run:1", ttl=30)
    assert new is not None and new.fence > old.fence
    assert await a.renew("run:1", "a", old.fence, 30) is None
    assert await a.release("run:1", "a", old.fence) is False


async def test_release_ends_the_lease_at_once_and_keeps_the_fence(pool: asyncpg.Pool) -> None:
    a, b = LeaseClient(pool=pool, owner="a"), LeaseClient(pool=pool, owner="b")
    lease = await a.claim("run:1", ttl=30)
    assert lease is not None
    assert await a.release("run:1", "a", lease.fence) is True
    assert await a.release("run:1", "a", lease.fence) is False
    info = await a.show("run:1")
    assert info is not None and not info.live and info.fence == lease.fence
    after = await b.claim("run:1", ttl=30)
    assert after is not None and after.fence > lease.fence


async def test_fences_stay_above_the_clock_floor_after_a_restore(pool: asyncpg.Pool) -> None:
    """A restore from the cluster's history brings back an old fence; the next
    claim must still issue a fence above every one issued since."""
    a = LeaseClient(pool=pool, owner="a")
    first = await a.claim("run:1", ttl=30)
    second = await a.claim("run:1", ttl=30)
    assert first is not None and second is not None
    # the "restore": the row is back to what it held at the first claim
    await pool.execute("UPDATE fencegate_leases SET fence = $1, expires_at = clock_timestamp()",
                       first.fence)
    third = await a.claim("run:1", ttl=30)
    assert third is not None and third.fence > second.fence


async def test_show_tells_live_from_dead(pool: asyncpg.Pool) -> None:
    a = LeaseClient(pool=pool, owner="a")
    assert await a.show("run:none") is None
    # live: a ttl no machine outlasts between the claim and the show
    lease = await a.claim("run:1", ttl=30)
    assert lease is not None
    info = await a.show("run:1")
    assert info is not None and info.live and info.owner == "a"
    short = await a.claim("run:2", ttl=0.2)
    assert short is not None
    await asyncio.sleep(0.3)  # past its ttl: a slow machine only adds to it
    info = await a.show("run:2")
    assert info is not None and not info.live and info.owner == "a"


async def test_bad_arguments_are_refused_before_the_database(pool: asyncpg.Pool) -> None:
    a = LeaseClient(pool=pool, owner="a")
    with pytest.raises(InvalidArgument):
        await a.claim("bad resource", ttl=30)
    with pytest.raises(InvalidArgument):
        await a.claim("run:1", ttl=-1)
    assert await a.show("run:1") is None
