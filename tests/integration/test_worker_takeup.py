"""The take-up after a job claim that got no answer runs only what that one
claim took, and only once.

A claim with no answer may have committed, so the worker's next turn asks for
the live claims under that claim's own owner and runs them. It never runs a
job whose run here has already ended (a ``max_attempts=1`` job whose failure
could not be recorded is not run again), and never a job another worker of the
same configured owner is running."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from leases import LeaseClient, Queue, Worker, database
from leases.queue import Job
from tests.support.cutproxy import CutProxy
from tests.support.faultproxy import FaultProxy
from tests.support.waiting import until

SHARED_OWNER_MARKER = "takeup-shared-owner-lost-claim"


async def test_a_job_whose_run_ended_here_is_not_taken_up_and_run_again(
    dsn: str, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="leases")
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

    def messages() -> list[str]:
        return [r.getMessage() for r in caplog.records]

    def end_then_claim_unanswered() -> bool:
        seen = messages()
        if "could not record the job's end" not in seen:
            return False
        after = seen[seen.index("could not record the job's end"):]
        return any(m.startswith("claim failed") for m in after)

    worker = Worker(Queue(LeaseClient(pool=slow, timeout=1.0), "once8"), handler,
                    concurrency=1, ttl=4.0, poll_min=0.05, poll_max=0.1,
                    backstop_interval=5.0)
    running = asyncio.get_running_loop().create_task(worker.run())
    try:
        await until(lambda: bool(calls), "the job ran")
        # the run's end got no answer, and a claim after it got none either
        await until(end_then_claim_unanswered, "the end and a later claim got no answer")
        proxy.set_mode("pass")

        async def left_its_claim() -> bool:
            state = await pool.fetchval("SELECT state FROM fencegate_jobs WHERE id = $1",
                                        job_id)
            return state != "claimed" or len(calls) > 1

        # the take-up has run by the time the job leaves its lapsed claim
        await until(left_its_claim, "the job left its claim")
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


async def test_a_take_up_never_runs_a_job_another_worker_of_the_owner_is_running(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    proxy = await CutProxy(dsn, marker=SHARED_OWNER_MARKER.encode()).start()
    slow = await database.create_pool(proxy.dsn(), min_size=1, max_size=6,
                                      command_timeout=1.0)
    client = LeaseClient(pool=slow, owner="w1", timeout=1.0)  # one process, its own id
    q = Queue(client, "shared8")
    first = await q.enqueue({"task": "long"})
    runs: list[tuple[str, int]] = []  # (worker, job) of every handler call, in order
    b_running = asyncio.Event()
    finish = asyncio.Event()

    def handler(name: str) -> Callable[[Job], Awaitable[str]]:
        async def handle(job: Job) -> str:
            runs.append((name, job.id))
            if name == "b":
                b_running.set()
                await finish.wait()  # a long job: it runs while the other worker polls
            return "done"
        return handle

    b = Worker(Queue(client, "shared8"), handler("b"), concurrency=1, ttl=3.0,
               poll_min=0.05, poll_max=0.2, backstop_interval=5.0)
    a = Worker(Queue(client, "shared8"), handler("a"), concurrency=2, ttl=3.0,
               poll_min=0.05, poll_max=0.2, backstop_interval=5.0)
    assert a.owner == b.owner == "w1"  # neither was given an owner
    loop = asyncio.get_running_loop()
    running_b = loop.create_task(b.run())
    running_a: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(b_running.wait(), 30)
        marked = await q.enqueue({"task": SHARED_OWNER_MARKER})  # a's claim of it: no answer
        running_a = loop.create_task(a.run())
        # the take-up has run once worker a has run the marked job and recorded its end
        await until(lambda: ("a", marked) in runs or ("a", first) in runs,
                    "worker a ran the marked job")

        async def marked_done() -> bool:
            state = await pool.fetchval("SELECT state FROM fencegate_jobs WHERE id = $1",
                                        marked)
            return state == "completed" or ("a", first) in runs

        await until(marked_done, "the marked job's end was recorded")
    finally:
        finish.set()
        a.stop()
        b.stop()
        await asyncio.wait_for(running_b, 10)
        if running_a is not None:
            await asyncio.wait_for(running_a, 10)
        await slow.close()
        await proxy.close()
    assert proxy.cut.is_set(), "no claim answer was lost: the test proves nothing"
    assert ("a", first) not in runs, (
        f"job {first} ran on worker a while worker b was still running it (runs: {runs}): "
        f"the take-up after a's unanswered claim read every live claim of owner 'w1', "
        f"b's running job among them")
