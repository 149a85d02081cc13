"""A worker never runs more handlers than its concurrency. Its slots are
counted per run, not per job id: a failed job this worker claims again while
the first run's end is still being answered takes a slot of its own.

Real PostgreSQL; only the moment the answer of ``fail`` reaches the worker is
shaped by the test (it committed, and its answer arrives late).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from typing import Any

import asyncpg

from leases import LeaseClient, NewJob, Queue, RetryPolicy, Worker
from leases.queue import MAX_BATCH, Job
from tests.support.waiting import until


class LateFailAnswers(Queue):
    """A queue whose ``fail`` commits at once and whose answer comes only
    once ``answer`` is set: the worker meanwhile claims the job again."""

    answer = asyncio.Event()

    async def fail(self, job: Job, error: BaseException | str) -> str | None:
        state = await super().fail(job, error)
        await self.answer.wait()
        return state


async def test_a_job_claimed_again_while_its_failed_run_ends_never_exceeds_concurrency(
    pool: asyncpg.Pool,
) -> None:
    q = LateFailAnswers(LeaseClient(pool=pool, owner="w1"), "slots",
                        retry=RetryPolicy(max_attempts=5, base_seconds=0.001, cap_seconds=0.001),
                        rng=random.Random(1))
    q.answer = asyncio.Event()
    flaky = await q.enqueue({"n": "flaky"})
    # the others fall due once the flaky job runs again
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    await q.enqueue_many([NewJob({"n": n}, run_at=later) for n in range(3)])
    running = peak = 0
    second_run = False
    seen: list[Any] = []

    async def handler(job: Job) -> None:
        nonlocal running, peak, second_run
        seen.append((job.payload["n"], job.attempts))
        if job.id == flaky and job.attempts == 1:
            raise RuntimeError("first attempt fails")  # its answer waits for q.answer
        running += 1
        peak = max(peak, running)
        try:
            if job.id == flaky:
                second_run = True
                await pool.execute("UPDATE fencegate_jobs SET run_at = clock_timestamp() "
                                   "WHERE id <> $1", flaky)
            elif second_run:
                # another job runs beside the second run: now the first run's
                # end is answered
                q.answer.set()
            await asyncio.sleep(1.5)  # long enough to overlap the runs claimed beside it
        finally:
            running -= 1

    worker = Worker(q, handler, concurrency=2, poll_min=0.01, poll_max=0.02, ttl=30)
    task = asyncio.create_task(worker.run())

    async def all_completed() -> bool:
        return (await q.stats()).get("completed") == 4

    try:
        await until(all_completed, "all four jobs completed")
    finally:
        q.answer.set()
        worker.stop()
        await task
    assert (await q.stats()) == {"completed": 4}, seen
    assert peak <= 2, (f"{peak} handlers ran at once with concurrency 2: the failed run's "
                       f"end freed the slot of the job's second run (runs: {seen})")


async def test_a_worker_with_more_slots_than_one_claim_may_take_still_claims(
    pool: asyncpg.Pool,
) -> None:
    """A claim takes at most ``MAX_BATCH`` jobs; a worker whose concurrency
    is larger claims that many at a time rather than asking for more, which
    the queue refuses (every claim failing, nothing ever run)."""
    q = Queue(LeaseClient(pool=pool, owner="wide"), "wide")
    await q.enqueue_many([NewJob({"n": n}) for n in range(3)])
    ran: list[int] = []

    async def handler(job: Job) -> None:
        ran.append(job.payload["n"])

    worker = Worker(q, handler, concurrency=MAX_BATCH + 1, poll_min=0.01, poll_max=0.02)
    task = asyncio.create_task(worker.run())

    async def all_completed() -> bool:
        return (await q.stats()).get("completed") == 3

    try:
        await until(all_completed, "the three jobs completed")
    finally:
        worker.stop()
        await task
    assert sorted(ran) == [0, 1, 2]
