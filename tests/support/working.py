"""Running a real ``Worker`` in a test until the database says it is done,
and the queue and jobs the worker tests share."""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from leases import LeaseClient, Queue, RetryPolicy, Worker
from leases.queue import Job
from tests.support.waiting import until


def worker_queue(db: asyncpg.Pool | LeaseClient, *, max_attempts: int = 3,
                 recovery_interval: float = 3600, kind: type[Queue] = Queue) -> Queue:
    """The queue ``mail`` of owner ``w1`` (on a pool, or on a client of the
    test's own), as worker tests run it: a failed attempt is retried 10 to
    20 ms later, up to ``max_attempts``, and claimers look for expired claims
    every ``recovery_interval`` (by default once, at their first claim)."""
    client = db if isinstance(db, LeaseClient) else LeaseClient(pool=db, owner="w1")
    return kind(client, "mail", rng=random.Random(1), recovery_interval=recovery_interval,
                retry=RetryPolicy(max_attempts=max_attempts, base_seconds=0.01,
                                  cap_seconds=0.02))


async def run_worker_until(worker: Worker, pool: asyncpg.Pool, query: str,
                           *args: Any) -> list[dict[str, Any]]:
    """Run ``worker`` while ``query`` (with ``args``) answers true, then stop
    it and wait for ``run()`` to return; what the event loop reported as
    unhandled meanwhile (a task whose exception nobody retrieved says so when
    it is collected, hence the collection before the handler is put back)."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    task = asyncio.create_task(worker.run())

    async def over() -> bool:
        assert not task.done(), task
        return not await pool.fetchval(query, *args)

    try:
        await until(over, f"the worker done: not ({query})")
    finally:
        worker.stop()
        await task
        gc.collect()
        loop.set_exception_handler(previous)
    return unhandled


async def run_failing_once(pool: asyncpg.Pool,
                           first_run: Callable[[], Awaitable[object]]) -> asyncpg.Record:
    """One job of ``worker_queue``: its first run awaits ``first_run`` (which
    raises), the second returns "ok". Recovery does not come for an hour, so
    only a failure recorded with its backoff lets the job run again. Nothing
    may go unhandled; the job's row once it is completed."""
    q = worker_queue(pool)
    await q.enqueue({"n": 1})
    runs = 0

    async def handler(job: Job) -> str:
        nonlocal runs
        runs += 1
        if runs == 1:
            await first_run()
        return "ok"

    worker = Worker(q, handler, concurrency=1, poll_min=0.01, poll_max=0.02,
                    backstop_interval=3600)
    unhandled = await run_worker_until(
        worker, pool, "SELECT state <> 'completed' FROM fencegate_jobs")
    assert unhandled == [], unhandled
    row = await pool.fetchrow("SELECT attempts, result_ref, last_error FROM fencegate_jobs")
    assert row is not None and (row["attempts"], row["result_ref"]) == (2, "ok"), row
    return row


async def run_four(pool: asyncpg.Pool, first: object, *,
                   max_attempts: int) -> dict[int, asyncpg.Record]:
    """Four jobs whose handlers return in the same turn (one batch of
    completions): the first returns ``first``, the others "ok". Each other
    job completes on its first attempt; the rows of all four, by position."""
    q = worker_queue(pool, max_attempts=max_attempts, recovery_interval=0.05)
    ids = [await q.enqueue({"n": n}) for n in range(4)]
    started: set[int] = set()
    all_started = asyncio.Event()

    async def handler(job: Job) -> object:
        started.add(job.id)
        if len(started) >= 4:
            all_started.set()
        await all_started.wait()  # all four return in the same turn
        return first if job.id == ids[0] else "ok"

    worker = Worker(q, handler, concurrency=4, poll_min=0.01, poll_max=0.02)  # type: ignore[arg-type]
    await run_worker_until(
        worker, pool, "SELECT count(*) FROM fencegate_jobs WHERE state IN ('queued', 'claimed')")
    rows = {r["id"]: r for r in await pool.fetch(
        "SELECT id, state, attempts, result_ref, octet_length(result_ref) AS size, last_error "
        "FROM fencegate_jobs")}
    for job_id in ids[1:]:
        assert (rows[job_id]["state"], rows[job_id]["attempts"],
                rows[job_id]["result_ref"]) == ("completed", 1, "ok")
    return {n: rows[job_id] for n, job_id in enumerate(ids)}
