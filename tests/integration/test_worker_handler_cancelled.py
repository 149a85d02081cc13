"""``asyncio.CancelledError`` that the handler raises itself (an inner task
it awaited was cancelled, a library's own timeout) is a failed attempt like
any other error: recorded under the job's fence, retried after a backoff.
Only a cancellation of the worker's own task (its lease lost, or shutdown
past the grace period) leaves the job unrecorded."""

from __future__ import annotations

import asyncio

import asyncpg

from leases import Worker
from leases.queue import Job
from tests.support.working import run_failing_once, worker_queue


async def test_a_cancellation_raised_by_the_handler_is_a_failed_attempt(
    pool: asyncpg.Pool,
) -> None:
    """The first run raises CancelledError with nothing cancelling the
    worker's task: the failure is recorded with its reason and a backoff
    (not left for recovery, which here does not come for an hour), and the
    second run completes. The worker runs on."""
    async def cancelled() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(3600))
        inner.cancel()
        await inner  # raises CancelledError into the handler

    row = await run_failing_once(pool, cancelled)
    assert row["last_error"].startswith("CancelledError"), row["last_error"]


async def test_a_handler_cancelled_past_the_grace_period_is_not_a_failure(
    pool: asyncpg.Pool,
) -> None:
    """Shutdown cancels a handler still running after the grace period: the
    worker is leaving, the job did not fail. No failure is recorded, and the
    job's lease is released for the next worker."""
    q = worker_queue(pool)
    await q.enqueue({"n": 1})
    started = asyncio.Event()

    async def handler(job: Job) -> str:
        started.set()
        await asyncio.Event().wait()  # never returns by itself
        return "unreachable"

    worker = Worker(q, handler, concurrency=1, poll_min=0.01, poll_max=0.02, grace=0.05,
                    backstop_interval=3600)
    task = asyncio.create_task(worker.run())
    await started.wait()
    worker.stop()
    await task
    row = await pool.fetchrow(
        "SELECT j.state, j.attempts, j.last_error, l.expires_at <= clock_timestamp() AS over"
        "  FROM fencegate_jobs j JOIN fencegate_leases l"
        "    ON l.resource = 'job:' || j.queue || ':' || j.id")
    assert row is not None
    assert (row["state"], row["attempts"], row["last_error"], row["over"]) == (
        "claimed", 1, None, True)
