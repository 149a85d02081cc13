"""Review 8: the take-up after an unanswered job claim runs again a job whose
run here has already ended: a job with ``max_attempts=1`` whose handler
failed runs a second time, at once, its first failure never recorded.

``Worker._take_up`` keeps every live claim of its owner that is not in
``_holding``, and ``_process`` drops a run from ``_holding`` as it ends,
whether or not its end reached the database. When the database goes away
just as a handler fails, ``fail`` and the release at the end of the lease's
block both get no answer: the job stays ``claimed`` under the worker's owner
with a live lease, and the run is no longer "running here". The claim of the
same turn gets no answer too, so the next turn takes up, and the job's
handler runs again under the same fence: a job the caller asked to run once
(``max_attempts=1``, "after max_attempts the job is dead") runs twice, with
no backoff and no attempt counted. Before the take-up, recovery would have
ended it dead once its lease lapsed.

Suggested fix: keep the (id, fence) of a run whose end was not recorded
(its ``fail`` or ``complete`` got no answer) out of the take-up (a set of
ended runs kept until their lease's expiry by the database's clock), or
have the take-up read only the jobs the unanswered claim took (a claim
token), never every live claim of the owner."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from leases import LeaseClient, Queue, Worker, database
from leases.queue import Job
from tests.support.faultproxy import FaultProxy


async def test_a_job_whose_run_ended_here_is_not_taken_up_and_run_again(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    job_id = await Queue(LeaseClient(pool=pool), "once8").enqueue(
        {"task": "charge"}, max_attempts=1)  # run it once: no retries wanted
    proxy = await FaultProxy(dsn).start()
    slow = await database.create_pool(proxy.dsn(), min_size=1, max_size=4,
                                      command_timeout=1.0)
    calls: list[int] = []

    async def handler(job: Job) -> str:
        calls.append(job.id)
        if len(calls) == 1:
            proxy.set_mode("drop")  # the database goes away as the handler fails
            raise RuntimeError("the card was declined")
        return "charged"

    worker = Worker(Queue(LeaseClient(pool=slow, timeout=1.0), "once8"), handler,
                    concurrency=1, ttl=4.0, poll_min=0.05, poll_max=0.1,
                    backstop_interval=5.0)
    running = asyncio.get_running_loop().create_task(worker.run())
    try:
        started = time.monotonic()
        while not calls and time.monotonic() - started < 5.0:
            await asyncio.sleep(0.02)
        assert calls, "the job never ran"
        await asyncio.sleep(0.6)  # fail, release and the next claim get no answer
        proxy.set_mode("pass")
        await asyncio.sleep(1.5)  # the take-up runs on the next turns
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
        await slow.close()
        await proxy.close()
    job = await pool.fetchrow("SELECT state, attempts, last_error FROM fencegate_jobs "
                              "WHERE id = $1", job_id)
    assert calls == [job_id], (
        f"the handler of job {job_id} (max_attempts=1) ran {len(calls)} times: its first "
        f"run failed while the database was away, the take-up found its lease still live "
        f"under the worker's owner and ran it again (the job is now {job['state']} after "
        f"{job['attempts']} attempt(s), last error {job['last_error']!r})")
