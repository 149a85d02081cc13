"""Review 8: after a job claim that got no answer, a worker takes up a job
another worker of the same owner is running: the job runs twice at once.

``Worker.__init__`` takes ``owner or queue.client.new_owner()``, and
``LeaseClient.new_owner()`` answers the client's fixed owner when it has one
(``LeaseClient(owner="w1")``, the README's own example). So two Workers of one
such client (or of two processes configured with the same owner) share the
owner, though neither was given one. docs/leases.md: "its next turn asks for
the live claims under its owner (a ``Worker`` makes an owner of its own unless
given one, so no other worker's jobs are among them) and runs those not
already running". ``Worker._take_up`` reads ``jobs_claimed_by`` for the owner
and keeps those not in its own ``_holding``: the other worker's running job
is among them, under its current fence, so the take-up runs it a second time
while the first run goes on, both renewing the same (owner, fence) lease.

Suggested fix: the take-up must only run what its own unanswered claim took:
record the claim's attempt in the database (a claim token per claim, written
with the jobs and looked up by the take-up), or give every Worker an owner of
its own even on a fixed-owner client (owner/worker-id) and refuse a take-up
when the owner was given."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg

from leases import LeaseClient, Queue, Worker, database
from leases.queue import Job
from tests.support.cutproxy import CutProxy

MARKER = "review8-shared-owner-lost-claim"


async def test_a_take_up_never_runs_a_job_another_worker_of_the_owner_is_running(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    proxy = await CutProxy(dsn, marker=MARKER.encode()).start()
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
        await asyncio.wait_for(b_running.wait(), 5)
        await q.enqueue({"task": MARKER})  # worker a claims it; that answer is lost
        running_a = loop.create_task(a.run())
        started = time.monotonic()
        while time.monotonic() - started < 5.0 and not any(
                w == "a" and j == first for w, j in runs):
            if proxy.cut.is_set() and any(w == "a" for w, _ in runs):
                await asyncio.sleep(0.5)  # the take-up has run: anything more comes now
                break
            await asyncio.sleep(0.05)
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
