"""A job claim that committed but whose answer was lost does not cost the job
an attempt it never ran: the worker finds what that claim took and runs it,
instead of leaving the job claimed for the ttl and recovered with its attempt
spent."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from leases import LeaseClient, Queue, Worker, database
from leases.queue import Job
from tests.support.cutproxy import CutProxy
from tests.support.waiting import until

MARKER = "job-claim-answer-lost"


async def test_a_job_whose_claim_answer_was_lost_still_runs(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    job_id = await Queue(LeaseClient(pool=pool), "mail").enqueue(
        {"task": MARKER}, max_attempts=1)  # "run it once": no retries wanted
    proxy = await CutProxy(dsn, marker=MARKER.encode()).start()
    slow = await database.create_pool(proxy.dsn(), min_size=1, max_size=4,
                                      command_timeout=1.0)
    ran: list[int] = []

    async def handler(job: Job) -> str:
        ran.append(job.id)
        return "done"

    # a ttl the take-up comes within however busy the machine (it must find
    # the lease live); had the claim's attempt been lost, the job would die
    # once it lapsed (its one attempt spent) and never run
    worker = Worker(Queue(LeaseClient(pool=slow, timeout=1.0), "mail"), handler,
                    ttl=10.0, poll_min=0.05, poll_max=0.2, backstop_interval=0.3)
    running = asyncio.get_running_loop().create_task(worker.run())
    try:
        with contextlib.suppress(AssertionError):  # told below, with the job's state
            await until(lambda: bool(ran), "the handler ran")
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
        await slow.close()
        await proxy.close()
    assert proxy.cut.is_set(), "the claim's answer was not the one lost: proves nothing"
    job = await pool.fetchrow("SELECT state, attempts, last_error FROM fencegate_jobs "
                              "WHERE id = $1", job_id)
    assert ran == [job_id], (
        f"the handler never ran; the job is {job['state']} after {job['attempts']} "
        f"attempt(s), last error {job['last_error']!r}: its one attempt went to a claim "
        f"whose answer was lost")
