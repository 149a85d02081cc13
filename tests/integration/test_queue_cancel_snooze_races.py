"""Red team: a cancel landing inside the user's own fenced transaction, and a
replay of a dead job whose unique key a newer job asks for."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from leases import FenceRefused, NewJob, sql
from tests.integration.test_queue_cancel import queue
from tests.support.locks import until_waiting
from tests.support.waiting import until


@pytest.mark.parametrize("isolation", ["read_committed", "repeatable_read", "serializable"])
async def test_a_cancel_inside_a_fenced_transaction_refuses_its_completion(
        pool: asyncpg.Pool, isolation: str) -> None:
    await pool.execute("CREATE TABLE rt_effects (job bigint)")
    q = queue(pool)
    job_id = await q.enqueue({})
    [job] = await q.claim("w", ttl=3600)
    async with pool.acquire() as conn:
        # under REPEATABLE READ and SERIALIZABLE a completion after a change
        # of the job's row is 40001, as docs/leases.md says: retry, refused
        with pytest.raises((FenceRefused, asyncpg.SerializationError)):
            async with job.transaction(conn, isolation=isolation):
                await conn.execute("INSERT INTO rt_effects VALUES ($1)", job.id)
                # the operator's cancel commits while the transaction is open
                await pool.fetch("SELECT * FROM fencegate_cancel_jobs('mail', $1::bigint[])",
                                 [job_id])
                await q.complete(job, connection=conn)
    assert await pool.fetchval("SELECT count(*) FROM rt_effects") == 0
    [row] = await q.list()
    assert row["state"] == "cancelled"


async def test_a_replayed_dead_job_keeps_its_unique_key(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    [first] = await q.enqueue_reporting([NewJob({}, unique_key="acct", max_attempts=1)])
    [job] = await q.claim("w", ttl=3600)
    await q.fail(job, "boom")
    [again] = await q.enqueue_reporting([NewJob({}, unique_key="acct")])
    assert again.id == first.id and again.deduplicated  # the dead job holds it
    assert await q.replay([first.id]) == 1
    [job] = await q.claim("w", ttl=3600)
    assert job.id == first.id



async def test_a_snooze_behind_a_cancel_in_flight_is_refused(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    job_id = await q.enqueue({})
    [job] = await q.claim("w", ttl=3600)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.fetch("SELECT * FROM fencegate_cancel_jobs('mail', $1::bigint[])", [job_id])
        snoozing = asyncio.create_task(q.snooze(job, 60))
        await until_waiting(pool, "Put a claimed job off")
        await tx.commit()
    assert not await snoozing
    [row] = await q.list()
    assert row["state"] == "cancelled"


async def test_a_cancel_behind_a_snooze_in_flight_cancels_the_snoozed_job(
        pool: asyncpg.Pool) -> None:
    q = queue(pool)
    job_id = await q.enqueue({})
    [job] = await q.claim("w", ttl=3600)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.fetchval(sql.query("snooze_job"), job.id, job.fence, 60.0)
        cancelling = asyncio.create_task(q.cancel_many([job_id]))
        await until_waiting(pool, "fencegate_cancel_jobs")
        await tx.commit()
    [done] = await cancelling
    assert done.cancelled and done.was == "scheduled"
    [row] = await q.list()
    assert row["state"] == "cancelled"
    assert await q.claim("w", ttl=3600) == []


async def test_a_zombie_s_snooze_after_its_job_was_claimed_again_counts_nothing(
        pool: asyncpg.Pool) -> None:
    q = queue(pool)
    await q.enqueue({})
    [zombie] = await q.claim("w", ttl=0.05)
    await until(lambda: pool.fetchval(
        "SELECT expires_at <= clock_timestamp() FROM fencegate_leases"), "its lease lapsed")
    await q.recover()
    [fresh] = await q.claim("w2", ttl=3600)
    assert fresh.id == zombie.id and fresh.fence > zombie.fence
    assert not await q.snooze(zombie, 60)
    [row] = await q.list()
    assert row["state"] == "claimed" and row["fence"] == fresh.fence
    assert row["attempts"] == 2 and row["snoozes"] == 0
