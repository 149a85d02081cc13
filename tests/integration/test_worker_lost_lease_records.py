"""Lease rule 6 in the worker: once a job's lease is known lost, nothing the
run produced is recorded under its fence. Not its result (``complete``), and
not its failure (``fail``, which would spend an attempt and a backoff on
work that is no longer this worker's): the job is left to recovery, which
runs it again under a new fence."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import asyncpg
import pytest

from leases import Worker, clock, sql
from leases.queue import Job
from tests.support.working import run_worker_until, worker_queue

TTL = 1.0


def pause_past_the_deadline(job: Job) -> None:
    """A stop-the-world pause (a long GC, a blocking call) inside the
    handler, until the job's local deadline has passed: the lease is lost
    as soon as anyone looks, though the database may still hold it live."""
    while clock.now() < job.lease.deadline:
        time.sleep(0.01)


async def run_until_settled(pool: asyncpg.Pool, worker: Worker) -> dict[str, Any]:
    """Run ``worker`` until its queue's one job is completed or dead; that
    job's row. Collects what the event loop reports as unhandled."""
    unhandled = await run_worker_until(
        worker, pool, "SELECT count(*) FROM fencegate_jobs WHERE state IN ('queued', 'claimed')")
    assert unhandled == [], unhandled
    row = await pool.fetchrow("SELECT state, attempts, result_ref, last_error "
                              "FROM fencegate_jobs")
    assert row is not None
    return dict(row)


async def test_a_result_returned_after_the_loss_is_not_recorded(pool: asyncpg.Pool) -> None:
    """The first run returns its result in the step that follows a pause
    past the lease's deadline (its completion is queued before the loop
    notices the loss). The result of a run in lost-ownership mode is not
    recorded: the job runs again, and the second run's result is the one
    stored."""
    q = worker_queue(pool, recovery_interval=0.05)
    await q.enqueue({"n": 1})
    runs: list[int] = []

    async def handler(job: Job) -> str:
        runs.append(job.fence)
        if len(runs) == 1:
            pause_past_the_deadline(job)
            return "from the zombie"
        return "from the second run"

    worker = Worker(q, handler, concurrency=1, ttl=TTL, poll_min=0.01, poll_max=0.02)
    row = await run_until_settled(pool, worker)
    assert (row["state"], row["result_ref"], row["attempts"]) == (
        "completed", "from the second run", 2)
    assert len(runs) == 2 and runs[1] > runs[0]


@pytest.mark.parametrize("how", ["check", "swallow"])
async def test_a_handler_failing_after_the_loss_spends_no_attempt_on_it(
    dsn: str, caplog: pytest.LogCaptureFixture, how: str,
) -> None:
    """After the pause, the first run either raises the loss itself
    (``lease.check()``, as a GatewayClient does before each request) or
    catches the cancellation that the loss brings and raises an error of its
    own. Neither is a failure of the job to record under the lost fence (a
    backoff, an attempt, a last_error naming the handler's error): the run
    is logged as a lost lease, and the job goes back through recovery."""
    # a worker that has run a while has fail_job prepared on its connections:
    # the statement then goes out in the first step, with no round trip to
    # prepare it first (in which a second cancellation would land)
    warm = await asyncpg.create_pool(dsn, min_size=4, max_size=4)
    try:
        conns = [await warm.acquire() for _ in range(4)]
        for conn in conns:
            await conn.fetchval(sql.query("fail_job"), 0, 0, "warm-up", 0.0)
            await warm.release(conn)
        await worker_queue(warm).enqueue({"n": 1})
        await _lost_then_failed(warm, caplog, how)
    finally:
        await warm.close()


async def _lost_then_failed(pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture,
                            how: str) -> None:
    q = worker_queue(pool, recovery_interval=0.05)
    runs: list[int] = []

    async def handler(job: Job) -> str:
        runs.append(job.fence)
        if len(runs) > 1:
            return "ok"
        pause_past_the_deadline(job)
        if how == "check":
            job.lease.check()
        try:
            await asyncio.sleep(0)  # the loss is noticed: cancelled here
        except asyncio.CancelledError:
            raise RuntimeError("gave up") from None
        raise AssertionError("the lost lease did not cancel the handler")

    caplog.set_level(logging.INFO, logger="fencegate")
    worker = Worker(q, handler, concurrency=1, ttl=TTL, poll_min=0.01, poll_max=0.02)
    row = await run_until_settled(pool, worker)
    assert (row["state"], row["result_ref"]) == ("completed", "ok")
    assert row["last_error"].startswith("lease expired"), row["last_error"]
    messages = [r.getMessage() for r in caplog.records if r.name == "fencegate.worker"]
    assert not [m for m in messages if "failed (attempt" in m], messages
    assert [m for m in messages if "was lost" in m], messages
