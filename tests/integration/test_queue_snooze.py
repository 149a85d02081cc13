"""Snoozing from inside a handler: the job runs again later, without spending
an attempt, and only its current holder can snooze it."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import pytest

from leases import InvalidArgument, LeaseClient, NewJob, Queue, Snooze, Worker
from leases.queue import Job
from tests.support.lapse import lapse
from tests.support.waiting import until


def queue(pool: asyncpg.Pool, name: str = "mail") -> Queue:
    return Queue(LeaseClient(pool=pool, owner="w"), name, rng=random.Random(1),
                 recovery_interval=3600)


async def test_a_snoozed_job_runs_again_later_without_spending_an_attempt(
    pool: asyncpg.Pool,
) -> None:
    q = queue(pool)
    job_id = await q.enqueue({}, max_attempts=1)
    [job] = await q.claim("w")
    before = await pool.fetchval("SELECT clock_timestamp()")
    assert await q.snooze(job, 3600)
    [row] = await q.list()
    assert (row["state"], row["attempts"], row["snoozes"]) == ("queued", 0, 1)
    assert (row["run_at"] - before).total_seconds() >= 3600
    assert (await q.stats()) == {"scheduled": 1}
    assert await q.claim("w") == []
    # the snooze ended the lease: the holder's late answers change nothing
    assert not await q.complete(job)
    assert await q.fail(job, "late") is None
    await pool.execute("UPDATE fencegate_jobs SET run_at = clock_timestamp() WHERE id = $1",
                       job_id)
    [again] = await q.claim("w")
    assert again.attempts == 1 and again.fence > job.fence  # its one attempt, still there
    assert await q.complete(again)


async def test_a_worker_handler_snoozes_by_raising_snooze(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    await q.enqueue({}, max_attempts=1)
    runs: list[int] = []

    async def handler(job: Job) -> str:
        runs.append(job.attempts)
        if len(runs) < 3:
            raise Snooze(0)
        return "done"

    worker = Worker(q, handler, poll_min=0.01, poll_max=0.02)
    task = asyncio.create_task(worker.run())

    async def completed() -> bool:
        return (await q.stats()) == {"completed": 1}

    try:
        await until(completed, "the job completed after two snoozes")
    finally:
        worker.stop()
        await task
    [row] = await q.list()
    assert runs == [1, 1, 1]
    assert (row["attempts"], row["snoozes"], row["result_ref"]) == (1, 2, "done")


async def test_a_snooze_keeps_the_jobs_place_in_its_ordering_key(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    first = await q.enqueue({}, ordering_key="acct-1")
    await q.enqueue({}, ordering_key="acct-1")
    [job] = await q.claim("w", limit=5)
    assert job.id == first
    assert await q.snooze(job, 3600)
    assert await q.claim("w", limit=5) == []  # the second waits behind the snoozed first


async def test_snoozes_racing_lease_expiry_count_once_or_not_at_all(
    pool: asyncpg.Pool,
) -> None:
    """Each job's lease lapses (and recovery runs) while its holder snoozes
    it: either the snooze counted (attempt given back, the lapse found no
    live lease) or recovery took the job back (the attempt spent, the snooze
    refused); never both, never neither."""
    q = queue(pool)
    n = 40
    await q.enqueue_many([NewJob({"n": i}) for i in range(n)])
    jobs = await q.claim("w", limit=n, ttl=3600)
    assert len(jobs) == n

    async def expire(job: Job) -> None:
        await lapse(pool, job.resource, after=[q])
        await q.recover()

    answers = await asyncio.gather(*(asyncio.gather(q.snooze(j, 3600), expire(j))
                                     for j in jobs))
    await q.recover()
    rows = {r["id"]: r for r in await q.list(limit=n)}
    for job, (snoozed, _) in zip(jobs, answers, strict=True):
        row = rows[job.id]
        assert row["state"] == "queued"
        if snoozed:
            assert (row["attempts"], row["snoozes"]) == (0, 1), row
        else:
            assert (row["attempts"], row["snoozes"]) == (1, 0), row
            assert row["last_error"].startswith("lease expired")


async def test_a_snooze_is_a_number_of_seconds(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    await q.enqueue({})
    [job] = await q.claim("w")
    for bad in (-1, float("nan"), float("inf"), 10**12, True):
        with pytest.raises(InvalidArgument):
            await q.snooze(job, bad)
    with pytest.raises(InvalidArgument):
        Snooze(-5)


async def test_a_handler_that_snoozes_through_the_queue_gets_nothing_more_recorded(
    pool: asyncpg.Pool,
) -> None:
    """``await queue.snooze(job, s)`` inside a Worker's handler: whatever the
    handler then returns or raises, the worker records nothing more for the
    run (no completion, no failure spending an attempt)."""
    q = queue(pool)
    await q.enqueue({"raise": False})
    await q.enqueue({"raise": True})
    seen: list[int] = []

    async def handler(job: Job) -> str:
        seen.append(job.id)
        assert await q.snooze(job, 3600)
        if job.payload["raise"]:
            raise RuntimeError("after the snooze")
        return "ignored"

    worker = Worker(q, handler, poll_min=0.01, poll_max=0.02)
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: len(seen) == 2, "both jobs ran")

        async def both_snoozed() -> bool:
            return (await q.stats()) == {"scheduled": 2}

        await until(both_snoozed, "both jobs snoozed")
    finally:
        worker.stop()
        await task
    for row in await q.list():
        assert (row["attempts"], row["snoozes"], row["last_error"], row["result_ref"]) == \
            (0, 1, None, None)
