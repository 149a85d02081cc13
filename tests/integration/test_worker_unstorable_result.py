"""A job whose result cannot be stored costs only itself: the jobs completed
beside it count, and it fails with the real reason."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import pytest

from leases import LeaseClient, Queue, RetryPolicy, Worker
from leases.queue import Job


@pytest.mark.parametrize("bad", ["ref\x00", 42, "\ud800"])
async def test_an_unstorable_result_fails_only_its_own_job(
    pool: asyncpg.Pool, bad: object,
) -> None:
    """Four jobs finish in the same turn, so their completions go as one
    batch. Job 0's result cannot be stored (PostgreSQL text holds no NUL, a
    number is not a result reference, a lone surrogate is not UTF-8): the
    other three complete on their first attempt, and job 0 fails each of its
    attempts with the reason its result could not be stored."""
    q = Queue(LeaseClient(pool=pool, owner="w1"), "mail", rng=random.Random(1),
              retry=RetryPolicy(max_attempts=3, base_seconds=0.01, cap_seconds=0.02),
              recovery_interval=0.05)
    ids = [await q.enqueue({"n": n}) for n in range(4)]
    started: set[int] = set()
    all_started = asyncio.Event()

    async def handler(job: Job) -> object:
        started.add(job.id)
        if len(started) >= 4:
            all_started.set()
        await all_started.wait()  # all four return in the same turn
        return bad if job.id == ids[0] else "ok"

    worker = Worker(q, handler, concurrency=4, poll_min=0.01, poll_max=0.02)  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    try:
        while await pool.fetchval(
                "SELECT count(*) FROM fencegate_jobs WHERE state IN ('queued', 'claimed')"):
            await asyncio.sleep(0.02)
    finally:
        worker.stop()
        await task
    rows = {r["id"]: r for r in await pool.fetch(
        "SELECT id, state, attempts, result_ref, last_error FROM fencegate_jobs")}
    for job_id in ids[1:]:
        assert (rows[job_id]["state"], rows[job_id]["attempts"],
                rows[job_id]["result_ref"]) == ("completed", 1, "ok")
    assert (rows[ids[0]]["state"], rows[ids[0]]["attempts"]) == ("dead", 3)
    assert "its result could not be stored" in rows[ids[0]]["last_error"]
