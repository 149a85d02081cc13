"""An error the worker did not foresee while recording a job's end (here a
bug in a Queue subclass's ``fail``) is logged with the job, traceback and
all, and ends only that run: no "Task exception was never retrieved", the
job's lease is released for recovery, and the worker goes on with the next
job."""

from __future__ import annotations

import asyncpg
import pytest

from leases import LeaseClient, Queue, Worker
from leases.queue import Job
from tests.support.working import run_worker_until


class BuggyFail(Queue):
    async def fail(self, job: Job, error: BaseException | str) -> str | None:
        raise TypeError("a bug in fail()")


async def test_an_unforeseen_error_recording_a_run_ends_only_that_run(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture,
) -> None:
    q = BuggyFail(LeaseClient(pool=pool, owner="w1"), "mail", recovery_interval=3600)
    first = await q.enqueue({"fails": True})
    second = await q.enqueue({"fails": False})

    async def handler(job: Job) -> str:
        if job.payload["fails"]:
            raise ValueError("the handler's own error")
        return "ok"

    worker = Worker(q, handler, concurrency=1, poll_min=0.01, poll_max=0.02,
                    backstop_interval=3600)
    unhandled = await run_worker_until(
        worker, pool, "SELECT state <> 'completed' FROM fencegate_jobs WHERE id = $1", second)
    assert unhandled == []
    over = await pool.fetchval("SELECT expires_at <= clock_timestamp() FROM fencegate_leases "
                               "WHERE resource = $1", f"job:mail:{first}")
    assert over
    logged = [r for r in caplog.records if getattr(r, "job", None) == first and r.exc_info]
    assert logged and isinstance(logged[0].exc_info[1], TypeError)  # type: ignore[index]
