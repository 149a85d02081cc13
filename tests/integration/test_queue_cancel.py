"""Cancelling jobs: a queued or scheduled job never runs, a running one's
lease ends (its fence is refused at the gateway, by fenced completion and by
renewal), its handler is cancelled through lost-ownership mode, and the job
stays cancelled whatever its old holder says afterwards."""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing
import os
import random
import signal

import asyncpg
import pytest

from leases import Cancel, FenceRefused, LeaseClient, NewJob, Queue, Worker
from leases.queue import Job
from tests.support.locks import until_waiting
from tests.support.waiting import GENEROUS_SECONDS, until


def queue(pool: asyncpg.Pool, owner: str = "w", name: str = "mail") -> Queue:
    return Queue(LeaseClient(pool=pool, owner=owner), name, rng=random.Random(1),
                 recovery_interval=3600)


async def admit(pool: asyncpg.Pool, job: Job) -> str:
    """What the gateway's fence check answers for the job's fence."""
    verdict: str = await pool.fetchval(
        "SELECT verdict FROM fencegate_admit_effect('c', $3, '\\x00'::bytea, $1, $2, 'p', "
        "1, 5, 0, 0)", job.resource, job.fence, f"k-{job.id}-{job.fence}")
    return verdict


async def test_a_cancelled_queued_or_scheduled_job_never_runs(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    now_id = await q.enqueue({"n": 1})
    later_id = await q.enqueue({"n": 2}, run_at=dt.datetime.now(dt.UTC) + dt.timedelta(0, 60))
    kept = await q.enqueue({"n": 3})
    assert await q.cancel_many([now_id, later_id]) == [
        Cancel(now_id, True, "queued"), Cancel(later_id, True, "scheduled")]
    [claimed] = await q.claim("w", limit=10)
    assert claimed.id == kept
    assert await q.claim("w", limit=10) == []
    states = {r["id"]: r for r in await q.list()}
    assert states[now_id]["state"] == states[later_id]["state"] == "cancelled"
    assert states[now_id]["finished_at"] is not None and states[now_id]["attempts"] == 0
    # again: left as it is, and said so; a replay of the dead does not revive it
    assert await q.cancel(now_id) == Cancel(now_id, False, "cancelled")
    assert await q.replay([now_id]) == 0
    assert (await q.stats())["cancelled"] == 2


async def test_a_cancel_leaves_a_finished_or_unknown_job_alone(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    other = queue(pool, name="other")
    job_id = await q.enqueue({})
    [job] = await q.claim("w")
    assert await q.complete(job)
    foreign = await other.enqueue({})
    assert await q.cancel_many([job_id, foreign, 10**9]) == [
        Cancel(job_id, False, "completed"), Cancel(foreign, False, "missing"),
        Cancel(10**9, False, "missing")]
    assert (await other.stats()) == {"queued": 1}


async def test_a_cancel_ends_a_running_jobs_fence_everywhere(pool: asyncpg.Pool) -> None:
    """After the cancel commits, the old holder's fence counts nowhere: the
    gateway refuses it, renewal is refused, and complete, fail, snooze and the
    SQL fenced completion change nothing."""
    q = queue(pool)
    job_id = await q.enqueue({"charge": 10})
    [job] = await q.claim("w", ttl=3600)
    assert await admit(pool, job) == "admitted"
    assert await q.cancel(job_id) == Cancel(job_id, True, "claimed")
    assert await admit(pool, job) == "lease_expired"
    assert await q.client.renew(job.resource, job.lease.owner, job.fence, 60) is None
    assert not await q.complete(job)
    assert await q.fail(job, "late") is None
    assert not await q.snooze(job, 0)
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.PostgresError) as refused:
            await conn.fetchval("SELECT fencegate_complete_job('mail', $1, $2)",
                                job_id, job.fence)
        assert refused.value.sqlstate == "FG412"
        with pytest.raises(FenceRefused):
            async with conn.transaction():
                await q.complete(job, connection=conn)
    assert await q.recover() == 0
    [row] = await q.list()
    assert (row["state"], row["attempts"], row["last_error"]) == ("cancelled", 1, None)
    assert await q.claim("w") == []


async def test_a_worker_cancels_the_running_handler_at_once(pool: asyncpg.Pool) -> None:
    """The worker listens for cancels: its handler is cancelled at once (a
    lease of an hour would not be renewed for minutes), through the lease's
    lost-ownership mode, and nothing is recorded for the run."""
    q = queue(pool)
    job_id = await q.enqueue({})
    started, ended = asyncio.Event(), asyncio.Event()
    outcome: list[str] = []

    async def handler(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        finally:
            ended.set()

    worker = Worker(q, handler, ttl=3600, poll_min=0.01, poll_max=0.05)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(started.wait(), GENEROUS_SECONDS)
        assert (await q.cancel(job_id)).was == "claimed"
        await asyncio.wait_for(ended.wait(), GENEROUS_SECONDS)
        assert outcome == ["cancelled"]
    finally:
        worker.stop()
        await task
    [row] = await q.list()
    assert (row["state"], row["attempts"], row["last_error"]) == ("cancelled", 1, None)


@pytest.mark.parametrize("how", ["statement", "transaction"])
async def test_cancel_racing_completion_exactly_one_wins(dsn: str, pool: asyncpg.Pool,
                                                         how: str) -> None:
    """Cancels and completions of the same jobs sent at the same moment, on
    separate connections: for each job exactly one counts, and the job's
    state (and, for a completion in the caller's transaction, its business
    row) says which."""
    await pool.execute("CREATE TABLE charges (job_id bigint PRIMARY KEY)")
    q = queue(pool)
    n = 40
    await q.enqueue_many([NewJob({"n": i}) for i in range(n)])
    jobs = await q.claim("w", limit=n, ttl=3600)
    assert len(jobs) == n

    async def complete(job: Job) -> bool:
        if how == "statement":
            return await q.complete(job)
        async with pool.acquire() as conn:
            try:
                async with job.transaction(conn):
                    await conn.execute("INSERT INTO charges VALUES ($1)", job.id)
                    await q.complete(job, connection=conn)
            except FenceRefused:
                return False
            return True

    async def cancel(job: Job) -> bool:
        return (await q.cancel(job.id)).cancelled

    results = await asyncio.gather(*(asyncio.gather(complete(j), cancel(j)) for j in jobs))
    rows = {r["id"]: r["state"] for r in await q.list(limit=n)}
    charged = {r["job_id"] for r in await pool.fetch("SELECT job_id FROM charges")}
    for job, (completed, cancelled) in zip(jobs, results, strict=True):
        assert completed != cancelled, f"job {job.id}: completed {completed}, " \
                                       f"cancelled {cancelled}"
        assert rows[job.id] == ("completed" if completed else "cancelled")
        if how == "transaction":
            assert (job.id in charged) == completed


async def test_a_cancel_behind_a_completion_in_flight_finds_it_completed(
    pool: asyncpg.Pool,
) -> None:
    """A completion in the caller's transaction holds the job's row when the
    cancel arrives: the cancel waits for it, and once it commits the job is
    completed and the cancel says so (no double effect)."""
    q = queue(pool)
    job_id = await q.enqueue({})
    [job] = await q.claim("w", ttl=3600)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await job.lease.check_fence(conn)
        assert await q.complete(job, connection=conn)
        cancelling = asyncio.create_task(q.cancel(job_id))
        await until_waiting(pool, "fencegate_cancel_jobs")
        await tx.commit()
    assert await cancelling == Cancel(job_id, False, "completed")
    [row] = await q.list()
    assert row["state"] == "completed"


async def test_a_completion_behind_a_cancel_in_flight_is_refused(pool: asyncpg.Pool) -> None:
    """The other order: a cancel not yet committed holds the job's row; the
    completion sent meanwhile waits, then counts nothing."""
    q = queue(pool)
    job_id = await q.enqueue({})
    [job] = await q.claim("w", ttl=3600)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.fetch("SELECT * FROM fencegate_cancel_jobs('mail', $1::bigint[])",
                         [job_id])
        completing = asyncio.create_task(q.complete(job))
        await until_waiting(pool, "fencegate_complete_jobs")
        await tx.commit()
    assert not await completing
    [row] = await q.list()
    assert row["state"] == "cancelled"


def _hang(dsn: str) -> None:
    async def main() -> None:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        q = Queue(LeaseClient(pool=pool, owner="doomed"), "crashy")

        async def handler(job: Job) -> None:
            await pool.execute("INSERT INTO test_started VALUES ($1, $2)", job.id, job.fence)
            await asyncio.sleep(3600)

        await Worker(q, handler, concurrency=1, ttl=1.0, poll_min=0.01).run()

    asyncio.run(main())


async def test_a_worker_killed_after_a_cancel_leaves_the_job_cancelled(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    """SIGKILL of a worker mid-handler right after its job was cancelled
    (whether or not it noticed yet): recovery does not put the job back, no
    other worker runs it."""
    await pool.execute("CREATE TABLE test_started (job_id bigint, fence bigint)")
    q = Queue(LeaseClient(pool=pool, owner="survivor"), "crashy", recovery_interval=0.05)
    job_id = await q.enqueue({})
    canary = await q.enqueue({})
    proc = multiprocessing.get_context("spawn").Process(target=_hang, args=(dsn,))
    proc.start()
    try:
        await until(lambda: pool.fetchval("SELECT count(*) > 0 FROM test_started"),
                    "the doomed worker started a job")
        started = await pool.fetchval("SELECT job_id FROM test_started")
        target = started if started in (job_id, canary) else job_id
        assert (await q.cancel(target)).was == "claimed"
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.join, GENEROUS_SECONDS)
    finally:
        if proc.is_alive():
            proc.kill()
    ran: list[int] = []

    async def handler(job: Job) -> None:
        ran.append(job.id)

    worker = Worker(q, handler, concurrency=1, poll_min=0.01, poll_max=0.05,
                    backstop_interval=0.05)
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: worker.backstop_passed.is_set() and len(ran) == 1,
                    "the other job ran, and recovery passed")
        worker.backstop_passed.clear()
        await until(worker.backstop_passed.is_set, "another recovery pass")
    finally:
        worker.stop()
        await task
    assert target not in ran
    states = {r["id"]: r["state"] for r in await q.list()}
    assert states[target] == "cancelled"


async def test_a_worker_without_listen_stops_a_cancelled_handler_at_its_next_renewal(
    pool: asyncpg.Pool,
) -> None:
    """Behind PgBouncer in transaction mode there is no LISTEN: the cancel is
    seen by the next renewal, refused, and the handler is cancelled the same
    way; nothing is recorded."""
    q = queue(pool)
    job_id = await q.enqueue({})
    started, ended = asyncio.Event(), asyncio.Event()

    async def handler(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()

    class Deaf(Worker):
        async def _listen(self) -> None:
            return None

    worker = Deaf(q, handler, ttl=1.5, poll_min=0.01, poll_max=0.05)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(started.wait(), GENEROUS_SECONDS)
        assert (await q.cancel(job_id)).cancelled
        await asyncio.wait_for(ended.wait(), GENEROUS_SECONDS)
    finally:
        worker.stop()
        await task
    [row] = await q.list()
    assert (row["state"], row["attempts"], row["last_error"]) == ("cancelled", 1, None)
