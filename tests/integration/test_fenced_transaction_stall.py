"""A worker stalled with its fenced transaction open cannot hold the resource
for ever, wherever in the wire protocol it stalls (issue 26: "a transaction
left open by a stalled worker: the next claim must not wait forever").

Found by the chaos suite's fenced-write trials (tests/chaos/fenced.py): asyncpg
prepares a statement it has not cached with Parse, Describe and Flush, no
Sync, and sends Bind, Execute and Sync after the answer. A worker frozen
between the two (SIGSTOP, a GC pause) leaves its backend "active", reading the
next message: idle_in_transaction_session_timeout, the bound that
fencegate_check_fence sets, is armed only when the backend is idle after a
Sync, so it would never fire, and the FOR KEY SHARE lock would hold back
every new grant of the resource until the worker wakes. So the next claim of
the expired lease ends the stalled session (fencegate_end_fenced)."""

from __future__ import annotations

import struct

import asyncpg

from leases import LeaseClient
from tests.support.waiting import until


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def parse_describe_flush(query: str) -> bytes:
    """What asyncpg sends to prepare ``query``: Parse, Describe, Flush."""
    return (_message(b"P", b"s1\0" + query.encode() + b"\0" + struct.pack("!h", 0))
            + _message(b"D", b"Ss1\0") + _message(b"H", b""))


async def _state(admin: asyncpg.Connection, pid: int) -> str | None:
    state: str | None = await admin.fetchval(
        "SELECT state FROM pg_stat_activity WHERE pid = $1", pid)
    return state


async def test_a_worker_stalled_mid_statement_in_a_fenced_transaction_is_ended(
        pool: asyncpg.Pool, dsn: str) -> None:
    lease = await LeaseClient(pool=pool, owner="a").claim("acct:1", ttl=0.5)
    assert lease is not None
    conn = await asyncpg.connect(dsn)
    admin = await asyncpg.connect(dsn)
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        await conn.execute("BEGIN")
        await conn.execute("SELECT fencegate_check_fence($1, $2)", lease.resource, lease.fence)
        # the worker prepares its next statement, and is frozen before it binds it
        transport = conn._transport  # type: ignore[attr-defined]
        transport.write(parse_describe_flush("SELECT 1"))
        await until(lambda: _state(admin, pid), "the backend answered the Describe")
        b = LeaseClient(pool=pool, owner="b")

        async def granted() -> bool:
            return await b.claim("acct:1", ttl=30) is not None

        # the lease had 0.5 s left; a bound of that order ends the session, and
        # the claim wins soon after
        await until(granted, "the next claim granted, the stalled session ended",
                    seconds=10)
    finally:
        conn.terminate()
        await admin.close()
