"""Red team: a pause waiting for the claims in flight, and the claims that
start after it. Claims lock the queue's row FOR SHARE; a pause's update waits
for those locks. A claim that starts while the pause waits takes its FOR
SHARE beside the ones held (PostgreSQL lets a share lock join a share lock
without queueing behind the waiting update), claims, and the pause now waits
for it too: a steady stream of overlapping claims can hold a pause off for
as long as it lasts, and jobs keep being claimed after `pause` was called."""

from __future__ import annotations

import asyncio

import asyncpg

from leases import NewJob, sql
from tests.integration.test_queue_cancel import queue
from tests.support.locks import waiting_on_locks
from tests.support.waiting import until


async def test_a_claim_started_while_a_pause_waits_claims_nothing(
        pool: asyncpg.Pool) -> None:
    q = queue(pool)
    await q.enqueue_many([NewJob({"n": i}) for i in range(10)])
    claim = sql.query("claim_jobs")
    async with pool.acquire() as first:
        tx = first.transaction()
        await tx.start()
        assert len(await first.fetch(claim, "mail", "a", 1, 3600.0)) == 1  # in flight
        pausing = asyncio.create_task(q.pause())
        await until(lambda: waiting_on_locks(pool, "INSERT INTO fencegate_queues"),
                    "the pause waiting for the claim in flight")
        later = asyncio.create_task(pool.fetch(claim, "mail", "b", 5, 3600.0))

        async def later_settled() -> bool:
            # (pg_stat_activity keeps a statement's first 1024 bytes: its comment)
            return later.done() or await waiting_on_locks(pool, "Up to $3 runnable jobs") > 0

        await until(later_settled, "the later claim answered or waiting")
        await tx.commit()
    await pausing
    assert await later == [], "a claim that started after the pause was called claimed"
