"""Shutdown bounds what it leaves behind: ``run()`` returns with nothing of
the worker's still running, a job's completion included. A completion whose
statement is stuck in the database (here behind a row lock) when the grace
period ends is cancelled with its job, not left to land after ``run()`` has
returned, when the caller may have closed the pool or the event loop."""

from __future__ import annotations

import asyncio

import asyncpg

from leases import Worker
from leases.queue import Job
from tests.support.locks import until_waiting
from tests.support.working import worker_queue


async def test_a_completion_stuck_at_the_end_of_the_grace_period_ends_with_run(
    pool: asyncpg.Pool,
) -> None:
    q = worker_queue(pool)
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
        await until_waiting(pool, "complete_job")  # the completion, on the row lock
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
