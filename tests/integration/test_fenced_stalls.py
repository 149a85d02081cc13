"""A worker that stalls with a fenced transaction open, in the middle of a
protocol exchange rather than idle between statements.

The invariant (issue 26, CONTRACT.md "Fenced writes in your own
transaction"): a transaction left open by a stalled worker delays the next
grant of its resource, but not forever. A PostgreSQL timeout
(idle_in_transaction_session_timeout) applies only while the session is idle
after a completed statement. A session stalled while the
server streams a result to it (wait_event ClientWrite) or while it reads a
COPY from it (ClientRead, state active) is not idle: neither that timeout nor
statement_timeout (a cancel is not served while the server waits on the
client) ever ends it, so its lease row stays FOR KEY SHARE locked and every
claim of the resource would be answered as held, long after the lease
expired. So a claim held back by a fenced transaction of an expired lease
ends that transaction's session (fencegate_end_fenced)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from leases import LeaseClient
from tests.support.waiting import until

#: what the fix should bound the wait by (a ttl of 1 s, a loaded machine)
BOUND_SECONDS = 20.0

#: the stalled worker: checks the fence, then reads a result far larger than
#: the socket buffers, discarding it (simple protocol: nothing accumulates)
WORKER = """
import asyncio, sys, asyncpg
async def main():
    conn = await asyncpg.connect(sys.argv[1])
    tx = conn.transaction()
    await tx.start()
    await conn.execute("SELECT fencegate_check_fence($1, $2)", sys.argv[2], int(sys.argv[3]))
    print(await conn.fetchval("SELECT pg_backend_pid()"), flush=True)
    await conn.execute("SELECT repeat('x', 10000) FROM generate_series(1, 100000000)")
asyncio.run(main())
"""


async def _state(admin: asyncpg.Connection, pid: int) -> tuple[str | None, str | None]:
    row = await admin.fetchrow("SELECT state, wait_event FROM pg_stat_activity WHERE pid = $1",
                               pid)
    return (row["state"], row["wait_event"]) if row else (None, None)


async def _claimed(pool: asyncpg.Pool, resource: str) -> bool:
    return await LeaseClient(pool=pool, owner="next").claim(resource, ttl=30) is not None


async def _end_lease(pool: asyncpg.Pool, resource: str) -> None:
    """The lease runs out under the stalled transaction (as its expiry would)."""
    await pool.execute("UPDATE fencegate_leases SET expires_at = clock_timestamp()"
                       " WHERE resource = $1", resource)


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[bytes]]]:
    workers: list[subprocess.Popen[bytes]] = []
    yield workers
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            worker.send_signal(signal.SIGKILL)
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()


async def test_a_worker_stopped_while_reading_a_result_does_not_hold_the_resource_forever(
        dsn: str, pool: asyncpg.Pool, admin: asyncpg.Connection,
        stopped: list[subprocess.Popen[bytes]]) -> None:
    lease = await LeaseClient(pool=pool, owner="a").claim("acct:1", ttl=1)
    assert lease is not None
    worker = subprocess.Popen([sys.executable, "-c", WORKER, dsn, lease.resource,
                               str(lease.fence)], stdout=subprocess.PIPE)
    stopped.append(worker)
    assert worker.stdout is not None
    line = await asyncio.get_running_loop().run_in_executor(None, worker.stdout.readline)
    pid = int(line)
    await until(lambda: _streaming(admin, pid), "the worker reading its big result")
    os.kill(worker.pid, signal.SIGSTOP)  # the worker stalls mid-read
    await until(lambda: _blocked_on(admin, pid, "ClientWrite"),
                "the server blocked writing to the stalled worker")
    await _end_lease(pool, lease.resource)
    await until(lambda: _claimed(pool, lease.resource),
                "the next claim, once the stalled lease is over", seconds=BOUND_SECONDS)


async def test_a_worker_stalled_in_a_copy_does_not_hold_the_resource_forever(
        dsn: str, pool: asyncpg.Pool, admin: asyncpg.Connection) -> None:
    lease = await LeaseClient(pool=pool, owner="a").claim("acct:1", ttl=1)
    assert lease is not None
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE rows_in (n int)")
    never = asyncio.Event()

    async def rows() -> AsyncIterator[bytes]:
        yield b"1\n"
        await never.wait()  # the worker stalls mid-COPY (a pause, a slow source)

    pid = await conn.fetchval("SELECT pg_backend_pid()")
    tx = conn.transaction()
    await tx.start()
    await conn.execute("SELECT fencegate_check_fence($1, $2)", lease.resource, lease.fence)
    copying = asyncio.get_running_loop().create_task(conn.copy_to_table("rows_in",
                                                                         source=rows()))
    try:
        await until(lambda: _blocked_on(admin, pid, "ClientRead", state="active"),
                    "the server reading the COPY from the stalled worker")
        await _end_lease(pool, lease.resource)
        await until(lambda: _claimed(pool, lease.resource),
                    "the next claim, once the stalled lease is over", seconds=BOUND_SECONDS)
    finally:
        copying.cancel()
        with contextlib.suppress(BaseException):
            await copying
        conn.terminate()


async def _streaming(admin: asyncpg.Connection, pid: int) -> bool:
    return (await _state(admin, pid))[0] == "active"


async def _blocked_on(admin: asyncpg.Connection, pid: int, event: str,
                      state: str = "active") -> bool:
    return await _state(admin, pid) == (state, event)
