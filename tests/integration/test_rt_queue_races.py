"""Red team: a cancel landing inside the user's own fenced transaction, and a
replay of a dead job whose unique key a newer job asks for."""

from __future__ import annotations

import asyncpg
import pytest

from leases import FenceRefused, NewJob
from tests.integration.test_queue_cancel import queue


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

