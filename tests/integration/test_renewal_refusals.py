"""A renewal the database refuses, or one whose lease row another
transaction holds locked, costs the holder nothing while its deadline lasts.

Refusals (a cancelled statement, a statement timeout, a deadlock victim)
mean nothing was changed: like no answer, they are retried before the local
deadline, never taken as the loss of the lease. And one lease row locked by
someone else (an admission, a claim, an operator's open transaction) holds
back the renewal of that lease only, never of the other leases renewed in
the same batch statement.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import asyncpg

from leases import Lease, LeaseClient, policy

#: a long ttl with frequent renewals: the deadline is far (24 s) from the
#: first renewal (0.6 s), so nothing here depends on how busy the machine is
TTL = 30.0
FREQUENT = policy.RenewalPolicy(TTL, renew_fraction=0.02, retry_fraction=0.01)
WAIT_SECONDS = 20.0


async def _lock_row(locker: asyncpg.Connection, resource: str,
                    ) -> asyncpg.transaction.Transaction:
    tx = locker.transaction()
    await tx.start()
    await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1 FOR UPDATE",
                         resource)
    return tx


async def _renewal_waiting_on_lock(admin: asyncpg.Connection) -> int:
    """The pid of a renewal that waits on a row lock, once there is one."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            pid = await admin.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%fencegate_renew_lease%' AND pid <> pg_backend_pid()"
                " LIMIT 1")
            if pid is not None:
                return int(pid)
            await asyncio.sleep(0.01)


async def _renewed(lease: Lease, past: dt.datetime) -> None:
    async with asyncio.timeout(WAIT_SECONDS):
        while lease.expires_at <= past:
            await asyncio.sleep(0.01)


async def test_a_cancelled_renewal_is_retried_not_taken_as_loss(
    pool: asyncpg.Pool, admin: asyncpg.Connection, locker: asyncpg.Connection,
) -> None:
    """The renewal's statement is cancelled (pg_cancel_backend) while it
    waits on the row: the holder keeps its lease and renews it once the row
    is free, and the guarded block runs on."""
    client = LeaseClient(pool=pool)
    lease = await client.claim("run:refused", ttl=TTL, renewal=FREQUENT)
    assert lease is not None
    first_expiry = lease.expires_at
    async with lease:
        tx = await _lock_row(locker, "run:refused")
        pid = await _renewal_waiting_on_lock(admin)
        assert await admin.fetchval("SELECT pg_cancel_backend($1)", pid)
        # the refusal has come back (the backend waits on the lock no more)
        async with asyncio.timeout(WAIT_SECONDS):
            while await admin.fetchval(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                    pid):
                await asyncio.sleep(0.01)
        await tx.rollback()
        await _renewed(lease, first_expiry)
        assert lease.lost is None
        lease.check()


async def test_one_locked_lease_row_holds_back_only_its_own_renewal(
    pool: asyncpg.Pool, locker: asyncpg.Connection,
) -> None:
    """Three renewals asked for in one turn go as one batch statement; the
    row of one is locked by another transaction. The other two are answered
    while it stays locked; the locked one is renewed once it is free."""
    client = LeaseClient(pool=pool)
    leases = [await client.claim(f"run:batch-{n}", ttl=TTL) for n in range(3)]
    a, b, c = leases
    assert a is not None and b is not None and c is not None
    tx = await _lock_row(locker, b.resource)
    renewals = [asyncio.ensure_future(client.renew(x.resource, x.owner, x.fence, TTL))
                for x in (a, b, c)]
    async with asyncio.timeout(WAIT_SECONDS):
        renewed_a, renewed_c = await asyncio.gather(renewals[0], renewals[2])
    assert renewed_a is not None and renewed_a > a.expires_at
    assert renewed_c is not None and renewed_c > c.expires_at
    assert not renewals[1].done()  # b's row is still locked
    await tx.rollback()
    async with asyncio.timeout(WAIT_SECONDS):
        renewed_b = await renewals[1]
    assert renewed_b is not None and renewed_b > b.expires_at
