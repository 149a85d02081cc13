"""A completion refused with ``Busy`` (no pooled connection came free in
time: nothing was sent) is sent again while the job's lease is still held:
an overloaded pool costs a wait, not a second run of a job that was done.
(The lease stays live meanwhile: renewals have connections of their own.)"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from leases import LeaseClient, Worker
from leases.queue import Job
from tests.support.working import worker_queue


async def test_a_completion_refused_for_a_busy_pool_is_sent_again(
    dsn: str, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fencegate.worker")
    client = LeaseClient(dsn, owner="w1", pool_size=3, acquire_timeout=0.2)
    try:
        q = worker_queue(client, recovery_interval=0.05)
        job_id = await q.enqueue({"n": 1})
        runs = 0
        running, go = asyncio.Event(), asyncio.Event()

        async def handler(job: Job) -> str:
            nonlocal runs
            runs += 1
            running.set()
            await go.wait()
            return "done"

        worker = Worker(q, handler, concurrency=1, poll_min=0.01, poll_max=0.02)
        task = asyncio.create_task(worker.run())
        try:
            await running.wait()
            own = await client.connect()
            # every connection but the one the worker LISTENs on: waiting for
            # each (a recovery may hold one a moment), never deciding from a
            # glance at the pool's counts, which a connection returned later
            # would falsify
            held = [await own.acquire() for _ in range(own.get_max_size() - 1)]
            go.set()
            # the completion gave up (a claim's Busy names no job)
            while not [r for r in caplog.records if getattr(r, "job", None) == job_id
                       and getattr(r, "error", None) == "Busy"]:
                assert not task.done(), task
                await asyncio.sleep(0.02)
            for conn in held:
                await own.release(conn)
            while await pool.fetchval("SELECT state <> 'completed' FROM fencegate_jobs"):
                assert not task.done(), task
                await asyncio.sleep(0.02)
        finally:
            go.set()
            worker.stop()
            await task
        row = await pool.fetchrow("SELECT attempts, result_ref FROM fencegate_jobs")
        assert row is not None and (row["attempts"], row["result_ref"], runs) == (1, "done", 1)
    finally:
        await client.close()
