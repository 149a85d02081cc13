"""fencegate_check_fence: a worker's own writes to the fencegate database,
fenced by its lease inside its own transaction (CONTRACT.md, "Fenced writes in
your own transaction").

The invariants: the check passes only for the current fence of a live lease,
and otherwise raises FG412 with the reason as its message, so the caller's
writes roll back with it; while the checked transaction is open no newer fence
of the resource is granted (a claim is answered as held), yet the holder's own
renewals and its own effects through the gateway go on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from leases import LeaseClient
from tests.support.waiting import until

WRITES = """CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)"""


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute(WRITES)
    await c.execute("INSERT INTO accounts VALUES (1, 100)")
    yield c
    with contextlib.suppress(asyncpg.InterfaceError, OSError):
        await c.close()


async def _balance(pool: asyncpg.Pool) -> int:
    value: int = await pool.fetchval("SELECT balance FROM accounts WHERE id = 1")
    return value


async def _refusal(conn: asyncpg.Connection, resource: str, fence: int) -> str:
    """The FG412 reason the check answers, inside a transaction whose write it
    rolls back."""
    with pytest.raises(asyncpg.PostgresError) as raised:
        async with conn.transaction():
            await conn.execute("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
            await conn.execute("SELECT fencegate_check_fence($1, $2)", resource, fence)
    assert raised.value.sqlstate == "FG412"
    return str(raised.value.args[0])


async def test_current_fence_of_a_live_lease_passes_and_writes_commit(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    lease = await LeaseClient(pool=pool, owner="a").claim("acct:1", ttl=30)
    assert lease is not None
    async with conn.transaction():
        await conn.execute("SELECT fencegate_check_fence($1, $2)", lease.resource, lease.fence)
        await conn.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    assert await _balance(pool) == 90


async def test_each_refusal_names_its_reason_and_rolls_the_writes_back(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    a = LeaseClient(pool=pool, owner="a")
    b = LeaseClient(pool=pool, owner="b")
    assert await _refusal(conn, "acct:none", 1) == "no_lease"
    old = await a.claim("acct:1", ttl=30)
    assert old is not None
    assert await _refusal(conn, "acct:1", old.fence + 1) == "invalid_fence"
    assert await old.release()
    assert await _refusal(conn, "acct:1", old.fence) == "lease_expired"
    new = await b.claim("acct:1", ttl=30)
    assert new is not None
    assert await _refusal(conn, "acct:1", old.fence) == "stale_fence"
    assert await _balance(pool) == 100


async def test_no_newer_grant_while_a_checked_transaction_is_open(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    """The zombie's transaction passed its check; its lease then ends. A claim
    is not granted while that transaction is open: it ends the zombie's
    session first, so the zombie's write never commits beside the new fence."""
    a = LeaseClient(pool=pool, owner="a")
    b = LeaseClient(pool=pool, owner="b")
    lease = await a.claim("acct:1", ttl=30)
    assert lease is not None
    tx = conn.transaction()
    await tx.start()
    await conn.execute("SELECT fencegate_check_fence($1, $2)", lease.resource, lease.fence)
    await conn.execute("UPDATE accounts SET balance = 0 WHERE id = 1")
    # the lease ends under the open transaction (as an expiry would)
    assert await pool.fetchval("UPDATE fencegate_leases SET expires_at = clock_timestamp()"
                               " WHERE resource = 'acct:1' RETURNING true")
    taken = await b.claim("acct:1", ttl=30)
    assert taken is not None and taken.fence > lease.fence
    with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
        await tx.commit()  # its session was ended before the grant
    assert await _balance(pool) == 100


async def test_the_holders_renewals_go_on_under_its_open_transaction(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    client = LeaseClient(pool=pool, owner="a")
    lease = await client.claim("acct:1", ttl=30)
    assert lease is not None
    async with conn.transaction():
        await conn.execute("SELECT fencegate_check_fence($1, $2)", lease.resource, lease.fence)
        # renewals, single and batched, are not held back by the check's lock
        renewed = await asyncio.wait_for(
            client.renew(lease.resource, lease.owner, lease.fence, 30), timeout=60)
        assert renewed is not None
        assert await asyncio.wait_for(lease.renew(), timeout=60) is None
        got = await pool.fetch(
            "SELECT ord, locked FROM fencegate_renew_leases($1, $2, $3, $4, $5)",
            ["acct:1"], ["a"], [lease.fence], [30.0], [0.0])
        assert [(r["ord"], r["locked"]) for r in got] == [(1, False)]


async def test_a_stalled_checked_transaction_is_ended_by_the_next_claim(
        pool: asyncpg.Pool, conn: asyncpg.Connection, admin: asyncpg.Connection) -> None:
    """A worker that stalls (SIGSTOP, a GC pause) with its fenced transaction
    open cannot hold the resource forever: once its lease has expired, the
    next claim ends the stalled session, the transaction rolls back, and the
    claim wins."""
    lease = await LeaseClient(pool=pool, owner="a").claim("acct:1", ttl=1)
    assert lease is not None
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    tx = conn.transaction()
    await tx.start()
    await conn.execute("UPDATE accounts SET balance = 0 WHERE id = 1")
    await conn.execute("SELECT fencegate_check_fence($1, $2)", lease.resource, lease.fence)
    # the worker stalls here, idle in its transaction, and never comes back
    await until(lambda: _expired(pool, lease.resource), "the stalled lease expired")
    await until(lambda: _claimed(pool, lease.resource), "the next claim")
    assert await _gone(admin, pid)
    assert await _balance(pool) == 100


async def test_a_live_holders_idle_transaction_is_not_ended(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    """The holder may keep its checked transaction open (idle, between
    statements) while its lease lives: a claim by another loses and ends
    nothing, and the transaction commits."""
    lease = await LeaseClient(pool=pool, owner="a").claim("acct:1", ttl=300)
    assert lease is not None
    async with conn.transaction():
        await conn.execute("SELECT fencegate_check_fence($1, $2)", lease.resource, lease.fence)
        assert not await _claimed(pool, lease.resource)
        assert not await pool.fetchval("SELECT fencegate_end_fenced('other')")
        await conn.execute("UPDATE accounts SET balance = 1 WHERE id = 1")
    assert await _balance(pool) == 1


async def _expired(pool: asyncpg.Pool, resource: str) -> bool:
    return bool(await pool.fetchval("SELECT expires_at <= clock_timestamp() FROM "
                                    "fencegate_leases WHERE resource = $1", resource))


async def _claimed(pool: asyncpg.Pool, resource: str) -> bool:
    return await LeaseClient(pool=pool, owner="b").claim(resource, ttl=30) is not None


async def _gone(admin: asyncpg.Connection, pid: int) -> bool:
    return not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
