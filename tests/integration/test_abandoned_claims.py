"""An abandoned claim never holds the resource, whichever lands first: the
claim or its abandon, each in a transaction held open so they overlap
(migration 0008)."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
import pytest

from tests.support.waiting import until

CLAIM = "SELECT fence FROM fencegate_claim_lease_unless_abandoned($1, $2, 60, true)"
ABANDON = "SELECT fencegate_abandon_claim($1, $2)"
LIVE = ("SELECT owner, expires_at > clock_timestamp() AS live FROM fencegate_leases "
        "WHERE resource = $1")


async def _blocked(pool: asyncpg.Pool, conn: asyncpg.Connection,
                   task: asyncio.Task[object]) -> None:
    """Wait until ``task``'s statement on ``conn`` waits for a lock (it must
    not finish meanwhile)."""
    async def waiting() -> bool:
        assert not task.done(), "the second statement did not wait for the first's lock"
        return bool(await pool.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
            conn.get_server_pid()))

    await until(waiting, "the second statement waiting for the first's lock")


async def _resource(pool: asyncpg.Pool, earlier_lease: bool) -> tuple[str, str]:
    """A fresh resource (with an ended lease of another owner, whose row the
    claim then updates, if ``earlier_lease``) and a fresh made-up owner."""
    resource, ghost = f"run:ab-{secrets.token_hex(3)}", f"ghost:{secrets.token_hex(4)}"
    if earlier_lease:
        await pool.execute("SELECT fencegate_claim_lease($1, 'earlier', 0.001, false)",
                           resource)
        await asyncio.sleep(0.01)
    return resource, ghost


@pytest.mark.parametrize("earlier_lease", [False, True], ids=["new-row", "existing-row"])
async def test_an_abandon_that_lands_while_the_claim_holds_the_row_ends_it(
    pool: asyncpg.Pool, earlier_lease: bool,
) -> None:
    resource, ghost = await _resource(pool, earlier_lease)
    async with pool.acquire() as claimer, pool.acquire() as abandoner:
        tx = claimer.transaction()
        await tx.start()
        fence = await claimer.fetchval(CLAIM, resource, ghost)
        assert fence is not None  # won, not yet committed
        abandon = asyncio.create_task(abandoner.fetchval(ABANDON, resource, ghost))
        await _blocked(pool, abandoner, abandon)
        await tx.commit()
        assert await abandon == fence  # it waited for the claim, then ended it
    row = await pool.fetchrow(LIVE, resource)
    assert row["owner"] == ghost and not row["live"]


@pytest.mark.parametrize("earlier_lease", [False, True], ids=["new-row", "existing-row"])
async def test_a_claim_that_lands_while_the_abandon_is_under_way_is_refused(
    pool: asyncpg.Pool, earlier_lease: bool,
) -> None:
    resource, ghost = await _resource(pool, earlier_lease)
    async with pool.acquire() as claimer, pool.acquire() as abandoner:
        tx = abandoner.transaction()
        await tx.start()
        assert await abandoner.fetchval(ABANDON, resource, ghost) is None  # nothing to end
        claim = asyncio.create_task(claimer.fetchval(CLAIM, resource, ghost))
        await _blocked(pool, claimer, claim)
        await tx.commit()
        assert await claim is None  # it waited for the abandon, then found the owner
    row = await pool.fetchrow(LIVE, resource)
    # no lease made up for a resource never claimed; an earlier one left as it was
    assert (row is None) if not earlier_lease else (row["owner"] == "earlier"
                                                     and not row["live"])
    # the resource is free for the next owner at once
    assert await pool.fetchval(CLAIM, resource, "next") is not None


async def test_a_claim_after_the_abandon_is_refused_and_other_owners_are_not(
    pool: asyncpg.Pool,
) -> None:
    resource, ghost = f"run:ab-{secrets.token_hex(3)}", f"ghost:{secrets.token_hex(4)}"
    assert await pool.fetchval(ABANDON, resource, ghost) is None
    assert await pool.fetchval(CLAIM, resource, ghost) is None
    assert await pool.fetchrow(LIVE, resource) is None  # never claimed, and shown so
    batch = await pool.fetch(
        "SELECT ord, owner FROM fencegate_claim_leases($1::text[], $2::text[], "
        "$3::float8[], true)", [resource, resource + "b"], [ghost, "other"], [60.0, 60.0])
    assert [(r["ord"], r["owner"]) for r in batch] == [(2, "other")]
    assert await pool.fetchval(CLAIM, resource, "other") is not None


async def test_abandoned_owners_are_forgotten_after_a_day(pool: asyncpg.Pool) -> None:
    old = f"ghost:{secrets.token_hex(4)}"
    await pool.execute("INSERT INTO fencegate_abandoned_owners (owner, created_at) "
                       "VALUES ($1, clock_timestamp() - interval '25 hours')", old)
    await pool.fetchval(ABANDON, f"run:ab-{secrets.token_hex(3)}", "ghost:any")
    assert await pool.fetchval("SELECT count(*) FROM fencegate_abandoned_owners "
                               "WHERE owner = $1", old) == 0
