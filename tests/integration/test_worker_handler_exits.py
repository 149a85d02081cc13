"""A handler that asks the process to exit (``SystemExit``, as ``sys.exit()``
raises, or ``KeyboardInterrupt``) stops the worker as ``stop()`` does: no
more claims, the other jobs in flight finish within the grace period and are
recorded, and then ``run()`` raises that exception to its caller. The job
whose handler raised it is not recorded as failed (the process is exiting,
the job did not fail); its lease is released, so recovery returns it to the
queue at once rather than when its ttl runs out."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap

import asyncpg
import pytest

#: the child: two jobs run side by side; the first one's handler raises once
#: the second one's is running, and the second one's finishes after that
CHILD = textwrap.dedent("""
    import asyncio, json, sys
    import asyncpg
    from leases import LeaseClient, Queue, Worker

    async def main(dsn, kind):
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=10)
        q = Queue(LeaseClient(pool=pool, owner="w1"), "mail")
        await q.enqueue({"exits": True})
        await q.enqueue({"exits": False})
        other_running, exiting = asyncio.Event(), asyncio.Event()

        async def handler(job):
            if job.payload["exits"]:
                await other_running.wait()
                exiting.set()
                raise {"SystemExit": SystemExit(3),
                       "KeyboardInterrupt": KeyboardInterrupt()}[kind]
            other_running.set()
            await exiting.wait()
            await asyncio.sleep(0)
            return "finished"

        worker = Worker(q, handler, concurrency=2, poll_min=0.01, poll_max=0.02)
        try:
            await worker.run()
        except BaseException as exc:
            print(json.dumps({"run": type(exc).__name__}), flush=True)
            raise
        print(json.dumps({"run": "returned"}), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt"])
async def test_an_exit_from_a_handler_shuts_the_worker_down_gracefully(
    dsn: str, pool: asyncpg.Pool, kind: str,
) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, dsn, kind, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=os.getcwd())
    out, err = await asyncio.wait_for(child.communicate(), 60)
    lines = out.decode().splitlines()
    assert lines and json.loads(lines[-1]) == {"run": kind}, (out, err)
    if kind == "SystemExit":
        assert child.returncode == 3, err
    rows = {r["payload"]: r for r in await pool.fetch(
        "SELECT j.payload::text AS payload, j.state, j.attempts, j.result_ref, j.last_error,"
        "       l.expires_at <= clock_timestamp() AS lease_over"
        "  FROM fencegate_jobs j JOIN fencegate_leases l"
        "    ON l.resource = 'job:' || j.queue || ':' || j.id")}
    other = rows['{"exits": false}']
    assert (other["state"], other["result_ref"]) == ("completed", "finished"), dict(other)
    exited = rows['{"exits": true}']
    assert exited["last_error"] is None, dict(exited)  # not a failure of the job
    assert exited["lease_over"], dict(exited)  # released: recovered at the next look
    assert b"Task exception was never retrieved" not in err, err
