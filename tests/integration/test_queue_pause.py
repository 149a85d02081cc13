"""Pausing a queue: from the moment a pause returns no claim of the queue
succeeds, jobs in flight finish, expired claims are still recovered, and a
resume wakes the workers."""

from __future__ import annotations

import asyncio
import random

import asyncpg

from leases import LeaseClient, NewJob, Queue, Worker
from leases.queue import Job
from tests.support.lapse import lapse
from tests.support.waiting import until


def queue(pool: asyncpg.Pool, name: str = "mail", owner: str = "w") -> Queue:
    return Queue(LeaseClient(pool=pool, owner=owner), name, rng=random.Random(1),
                 recovery_interval=3600)


async def test_a_paused_queue_claims_nothing_until_resumed(pool: asyncpg.Pool) -> None:
    q, other = queue(pool), queue(pool, "other")
    await q.enqueue({})
    await other.enqueue({})
    assert await q.paused_since() is None
    since = await q.pause()
    assert await q.pause() == since  # paused already: as it was
    assert await q.paused_since() == since
    assert await q.claim("w", limit=5) == []
    assert len(await other.claim("w", limit=5)) == 1  # other queues run on
    assert await q.resume()
    assert not await q.resume()
    assert len(await q.claim("w", limit=5)) == 1


async def test_a_queue_never_used_can_be_paused_before_its_first_job(
    pool: asyncpg.Pool,
) -> None:
    q = queue(pool, "fresh")
    await q.pause()
    await q.enqueue({})
    assert await q.claim("w") == []
    await q.resume()
    assert len(await q.claim("w")) == 1


async def test_a_pause_lets_in_flight_jobs_finish_and_a_resume_wakes_the_worker(
    pool: asyncpg.Pool,
) -> None:
    q = queue(pool)
    await q.enqueue_many([NewJob({"n": i}) for i in range(6)])
    release = asyncio.Event()
    started: list[int] = []

    async def handler(job: Job) -> None:
        started.append(job.id)
        await release.wait()

    # a long idle poll: only the resume's notification wakes it in time
    worker = Worker(q, handler, concurrency=2, poll_min=0.01, poll_max=3600)
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: len(started) == 2, "two jobs in flight")
        await q.pause()
        release.set()

        async def two_done() -> bool:
            return (await q.stats()).get("completed") == 2

        await until(two_done, "the two in flight completed while paused")
        assert (await q.stats()) == {"completed": 2, "queued": 4}
        assert len(started) == 2
        await q.resume()

        async def all_done() -> bool:
            return (await q.stats()) == {"completed": 6}

        await until(all_done, "the rest ran after the resume")
    finally:
        worker.stop()
        await task


async def test_no_claim_commits_after_a_pause_has_returned(pool: asyncpg.Pool) -> None:
    """Claimers on connections of their own claim in a loop while the queue
    is paused: every claim that counted committed before the pause returned
    (the claims' lock on the queue's row is what the pause waits for)."""
    q = queue(pool)
    await q.enqueue_many([NewJob({"n": i}) for i in range(2000)])
    claimers = [queue(pool, owner=f"c{i}") for i in range(4)]
    rounds = [0] * len(claimers)
    paused = asyncio.Event()
    after: list[int] = []

    async def claim(i: int) -> None:
        while True:
            jobs = await claimers[i].claim(f"c{i}", limit=2)
            rounds[i] += 1
            if paused.is_set():
                after.extend(j.id for j in jobs)
                if rounds[i] > 1000:
                    return
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(claim(i)) for i in range(len(claimers))]
    try:
        await until(lambda: min(rounds) >= 5, "every claimer claiming")
        await q.pause()
        claimed_at_pause = await pool.fetchval(
            "SELECT count(*) FROM fencegate_jobs WHERE state = 'claimed'")
        paused.set()
        start = list(rounds)
        await until(lambda: all(r >= s + 20 for r, s in zip(rounds, start, strict=True)),
                    "every claimer claimed 20 more times after the pause")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert claimed_at_pause > 0
    # a claim answered after the pause may have committed before it returned;
    # none committed after: the count of claimed jobs did not move
    assert await pool.fetchval(
        "SELECT count(*) FROM fencegate_jobs WHERE state = 'claimed'") == claimed_at_pause
    assert len(after) <= 2 * len(claimers)


async def test_a_paused_queue_recovers_an_expired_claim_and_holds_it(
    pool: asyncpg.Pool,
) -> None:
    q = queue(pool)
    job_id = await q.enqueue({})
    [job] = await q.claim("w")
    await q.pause()
    await lapse(pool, job.resource, after=[q])
    assert not await q.complete(job)  # its holder is a zombie now
    assert await q.recover() == 1
    assert (await q.stats()) == {"queued": 1}
    assert await q.claim("w") == []
    await q.resume()
    [again] = await q.claim("w")
    assert again.id == job_id and again.fence > job.fence and again.attempts == 2


async def test_the_metrics_show_paused_queues_and_count_cancels_and_snoozes(
    pool: asyncpg.Pool,
) -> None:
    from prometheus_client import CollectorRegistry

    from leases import metrics, observe
    from tests.integration.test_observe import samples

    q, other = queue(pool, "gauged"), queue(pool, "gauged-other")
    await other.enqueue({})
    cancelled = metrics.JOBS.labels(queue="gauged", event="cancelled")
    snoozed = metrics.JOBS.labels(queue="gauged", event="snoozed")
    before = (cancelled._value.get(), snoozed._value.get())
    await q.cancel(await q.enqueue({}))
    await q.enqueue({})
    [job] = await q.claim("w")
    assert await q.snooze(job, 60)
    assert (cancelled._value.get(), snoozed._value.get()) == (before[0] + 1, before[1] + 1)
    await q.pause()
    collector = observe.QueueCollector(LeaseClient(pool=pool))
    await collector.refresh()
    found = samples(observe.exposition(collector, CollectorRegistry()).decode())
    assert found[("fencegate_queue_paused", (("queue", "gauged"),))] == 1
    assert found[("fencegate_queue_paused", (("queue", "gauged-other"),))] == 0
    assert found[("fencegate_queue_jobs", (("queue", "gauged"), ("state", "scheduled")))] == 1
