"""A handler's error is stored as the job's ``last_error`` whatever its
message holds: a NUL (which PostgreSQL text cannot hold), a lone surrogate
(not UTF-8), or a ``__str__`` that raises. The failure is recorded with its
backoff like any other, never lost to a refused statement (the job would
then wait for recovery, without its backoff or its reason) nor escaping the
job's task."""

from __future__ import annotations

import asyncpg
import pytest

from leases import Worker
from leases.queue import Job
from tests.support.working import run_worker_until, worker_queue


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@pytest.mark.parametrize("error", [
    ValueError("bad\x00byte"), ValueError("half a pair: \ud800"), Unprintable(),
], ids=["nul", "surrogate", "unprintable"])
async def test_an_error_with_an_unstorable_message_is_recorded(
    pool: asyncpg.Pool, error: Exception,
) -> None:
    q = worker_queue(pool)
    await q.enqueue({"n": 1})
    runs = 0

    async def handler(job: Job) -> str:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise error
        return "ok"

    worker = Worker(q, handler, concurrency=1, poll_min=0.01, poll_max=0.02,
                    backstop_interval=3600)
    # recovery does not come for an hour: only a recorded failure lets the
    # job run again now
    unhandled = await run_worker_until(
        worker, pool, "SELECT state <> 'completed' FROM fencegate_jobs")
    assert unhandled == []
    row = await pool.fetchrow("SELECT attempts, last_error FROM fencegate_jobs")
    assert row is not None and row["attempts"] == 2
    assert row["last_error"].startswith(type(error).__name__), row["last_error"]
