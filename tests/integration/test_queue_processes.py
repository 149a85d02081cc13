"""The queue under real processes: many claimers, and a worker killed mid-job."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time

import asyncpg

from leases import LeaseClient, NewJob, Queue, Worker
from leases.queue import Job
from tests.support.waiting import GENEROUS_SECONDS, until

JOBS = 3000
PROCESSES = 3


def _drain(dsn: str, owner: str) -> None:
    async def main() -> None:
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=10)
        q = Queue(LeaseClient(pool=pool, owner=owner), "bulk", recovery_interval=0.5)

        async def handler(job: Job) -> None:
            await pool.execute("INSERT INTO test_runs (job_id, fence, owner) VALUES ($1, $2, $3)",
                               job.id, job.fence, owner)

        worker = Worker(q, handler, concurrency=8, poll_min=0.01, poll_max=0.05)
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stats = await q.stats()
            if not stats.get("queued") and not stats.get("claimed"):
                break
            await asyncio.sleep(0.1)
        worker.stop()
        await task
        await pool.close()

    asyncio.run(main())


async def test_processes_complete_every_job_exactly_once(dsn: str, pool: asyncpg.Pool) -> None:
    await pool.execute("CREATE TABLE test_runs (job_id bigint, fence bigint, owner text)")
    q = Queue(LeaseClient(pool=pool), "bulk")
    for start in range(0, JOBS, 1000):
        await q.enqueue_many([NewJob({"n": n}) for n in range(start, start + 1000)])
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_drain, args=(dsn, f"proc-{i}")) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        await asyncio.to_thread(p.join, 180)
        assert p.exitcode == 0
    assert await q.stats() == {"completed": JOBS}
    runs = await pool.fetch("SELECT job_id, count(*) AS n FROM test_runs GROUP BY job_id")
    assert len(runs) == JOBS, "a job was lost"
    assert max(r["n"] for r in runs) == 1, "a job ran twice"
    owners = await pool.fetch("SELECT owner, count(*) FROM test_runs GROUP BY owner")
    assert len(owners) == PROCESSES, "not every process took part: no race was tested"


def _hang_on_first_job(dsn: str) -> None:
    async def main() -> None:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        q = Queue(LeaseClient(pool=pool, owner="doomed"), "crashy")

        async def handler(job: Job) -> None:
            await pool.execute("INSERT INTO test_started (job_id, fence) VALUES ($1, $2)",
                               job.id, job.fence)
            await asyncio.sleep(3600)

        await Worker(q, handler, concurrency=1, ttl=1.0, poll_min=0.01).run()

    asyncio.run(main())


async def test_a_killed_worker_s_job_is_claimed_again_with_a_higher_fence(
    dsn: str, pool: asyncpg.Pool
) -> None:
    await pool.execute("CREATE TABLE test_started (job_id bigint, fence bigint)")
    q = Queue(LeaseClient(pool=pool, owner="survivor"), "crashy", recovery_interval=0.1)
    job_id = await q.enqueue({"send": "invoice"})
    proc = multiprocessing.get_context("spawn").Process(target=_hang_on_first_job, args=(dsn,))
    proc.start()
    try:
        await until(lambda: pool.fetchval("SELECT count(*) > 0 FROM test_started"),
                    "the doomed worker started the job")
        started = await pool.fetchrow("SELECT job_id, fence FROM test_started")
        assert started is not None and started["job_id"] == job_id
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)  # mid-job: no release, no fail, nothing
        await asyncio.to_thread(proc.join, GENEROUS_SECONDS)
    finally:
        if proc.is_alive():
            proc.kill()
    done: list[int] = []

    async def handler(job: Job) -> None:
        done.append(job.fence)

    worker = Worker(q, handler, concurrency=1, poll_min=0.02, poll_max=0.05,
                    backstop_interval=0.2)
    task = asyncio.create_task(worker.run())
    try:  # the killed worker's 1 s lease lapses first
        await until(lambda: bool(done), "the killed worker's job ran again")
    finally:
        worker.stop()
        await task
    assert done[0] > started["fence"]
    [row] = await q.list()
    assert row["state"] == "completed" and row["attempts"] == 2
    verdict = await pool.fetchval(
        "SELECT verdict FROM fencegate_admit_effect('c', 'k', '\\x00'::bytea, $1, $2, 'p', "
        "1, 5, 0, 0)",
        f"job:crashy:{job_id}", started["fence"])
    assert verdict == "stale_fence"


def _serve_until_sigterm(dsn: str) -> None:
    async def main() -> None:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        q = Queue(LeaseClient(pool=pool, owner="graceful"), "graceful")

        stopped = asyncio.Event()

        class Stopping(Worker):
            def stop(self) -> None:  # what SIGTERM calls
                super().stop()
                stopped.set()

        async def handler(job: Job) -> None:
            await pool.execute("INSERT INTO test_started (job_id, fence) VALUES ($1, $2)",
                               job.id, job.fence)
            await stopped.wait()  # still working when SIGTERM arrives

        await Stopping(q, handler, concurrency=2, ttl=30, poll_min=0.01, grace=30).run(
            handle_signals=True)
        await pool.close()

    asyncio.run(main())


async def test_sigterm_stops_claiming_and_lets_in_flight_jobs_finish(
    dsn: str, pool: asyncpg.Pool
) -> None:
    await pool.execute("CREATE TABLE test_started (job_id bigint, fence bigint)")
    q = Queue(LeaseClient(pool=pool), "graceful")
    await q.enqueue_many([NewJob({"n": i}) for i in range(6)])
    proc = multiprocessing.get_context("spawn").Process(target=_serve_until_sigterm,
                                                        args=(dsn,))
    proc.start()
    try:
        await until(lambda: pool.fetchval("SELECT count(*) = 2 FROM test_started"),
                    "the worker process running two jobs")
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGTERM)
        await asyncio.to_thread(proc.join, GENEROUS_SECONDS)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
    stats = await q.stats()
    # the two in flight finished; nothing more was claimed after SIGTERM
    assert stats == {"completed": 2, "queued": 4}
