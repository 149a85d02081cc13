"""Shutdown bounds what it leaves behind: ``run()`` returns with nothing of
the worker's still running, a job's completion included. A completion whose
statement is stuck in the database (here behind a row lock) when the grace
period ends is cancelled with its job, not left to land after ``run()`` has
returned, when the caller may have closed the pool or the event loop."""

from __future__ import annotations

import asyncio
import random

import asyncpg

from leases import LeaseClient, Queue, RetryPolicy, Worker
from leases.queue import Job


async def test_a_completion_stuck_at_the_end_of_the_grace_period_ends_with_run(
    pool: asyncpg.Pool,
) -> None:
    q = Queue(LeaseClient(pool=pool, owner="w1"), "mail", rng=random.Random(1),
              retry=RetryPolicy(max_attempts=3, base_seconds=0.01, cap_seconds=0.02),
              recovery_interval=3600)
    job_id = await q.enqueue({"n": 1})
    running, go = asyncio.Event(), asyncio.Event()

    async def handler(job: Job) -> str:
        running.set()
        await go.wait()
        return "done"

    worker = Worker(q, handler, concurrency=1, poll_min=0.01, poll_max=0.02, grace=0.2,
                    backstop_interval=3600)
    task = asyncio.create_task(worker.run())
    locker = await pool.acquire()
    tx = locker.transaction()
    try:
        await running.wait()
        await tx.start()
        await locker.execute("SELECT 1 FROM fencegate_jobs WHERE id = $1 FOR UPDATE", job_id)
        go.set()
        # the completion's statement waits on the row lock
        while not await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%complete_job%' AND pid <> pg_backend_pid()"):
            await asyncio.sleep(0.02)
        worker.stop()
        await task
        left = [t for t in asyncio.all_tasks() if not t.done()
                and t.get_coro().__qualname__.startswith(
                    ("Worker.", "GroupCommit.", "Completions.", "Recorder."))]
        assert left == [], left
    finally:
        await tx.rollback()
        await pool.release(locker)
        if not task.done():
            worker.stop()
            await task
