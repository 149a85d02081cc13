"""Lease rows held locked by another transaction cost only their own
leases, never the other leases of the process.

A ``LeaseClient`` with a pool of its own keeps ``KEEPING_POOL_SIZE`` (2)
connections for renewals and releases. A renewal whose row is locked is
renewed alone, and a lost lease is released in the background: both wait on
the row lock. Were that wait unbounded, two locked rows (an operator's open
transaction, say) would hold both kept connections for as long as the lock
lasts, and every other lease of the process, whose rows nobody locks, would
find no connection to renew on and be lost at its deadline.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import asyncpg

from leases import Lease, LeaseClient, policy

WAIT_SECONDS = 60.0
#: the leases whose rows get locked: renewed often, far from their deadline
#: (48 s), so they stay held while the test looks at the third lease
LOCKED_TTL = 60.0
LOCKED_POLICY = policy.RenewalPolicy(LOCKED_TTL, renew_fraction=0.01, retry_fraction=0.005)
#: the third lease, whose row nobody locks: it must renew on time (every
#: 3.3 s; it gives up 8 s after its last renewal was sent)
FREE_TTL = 10.0


async def _changed(lease: Lease, past: dt.datetime) -> None:
    """Until the lease has been renewed past ``past``, or is lost."""
    async with asyncio.timeout(WAIT_SECONDS):
        while lease.expires_at <= past and lease.lost is None:
            await asyncio.sleep(0.01)


async def _waiting_on_locks(admin: asyncpg.Connection, count: int, what: str) -> None:
    async with asyncio.timeout(WAIT_SECONDS):
        while await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE $1 AND pid <> pg_backend_pid()", what) < count:
            await asyncio.sleep(0.01)


async def test_two_locked_rows_do_not_starve_the_renewal_of_a_third_lease(
    dsn: str, admin: asyncpg.Connection, locker: asyncpg.Connection,
) -> None:
    """Two leases' rows are locked by an open transaction while their
    renewals are due; a third lease, whose row nobody locks, goes on
    renewing (twice over its whole deadline) and is never lost."""
    async with LeaseClient(dsn) as client:
        free = await client.claim("run:free", FREE_TTL)
        a = await client.claim("run:locked-a", LOCKED_TTL, renewal=LOCKED_POLICY)
        b = await client.claim("run:locked-b", LOCKED_TTL, renewal=LOCKED_POLICY)
        assert free is not None and a is not None and b is not None
        async with free, a, b:
            # the free lease's last renewal before the locks was sent before
            # the locked ones' last: its deadline comes first
            await _changed(free, free.expires_at)
            await _changed(a, a.expires_at)
            await _changed(b, b.expires_at)
            tx = locker.transaction()
            await tx.start()
            try:
                await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = ANY($1)"
                                     " FOR UPDATE", [a.resource, b.resource])
                await _waiting_on_locks(admin, 2, "%fencegate_renew_lease%")
                for _ in range(3):  # past the deadline the free lease had at the lock
                    await _changed(free, free.expires_at)
                    assert free.lost is None, f"a lease nobody locked was lost: {free.lost}"
            finally:
                await tx.rollback()
            await _changed(a, a.expires_at)
            await _changed(b, b.expires_at)
            assert a.lost is None and b.lost is None
            free.check()


async def test_a_locked_row_holds_back_only_its_own_release_in_a_batch(
    dsn: str, locker: asyncpg.Connection,
) -> None:
    """Two releases asked for in one turn go as one statement; one row is
    locked by an open transaction. The other lease is released while the
    lock is held; the locked one once it is free."""
    async with LeaseClient(dsn) as client:
        a = await client.claim("run:release-a", LOCKED_TTL)
        b = await client.claim("run:release-b", LOCKED_TTL)
        assert a is not None and b is not None
        tx = locker.transaction()
        await tx.start()
        try:
            await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1"
                                 " FOR UPDATE", b.resource)
            releases = [asyncio.ensure_future(client.release(x.resource, x.owner, x.fence))
                        for x in (a, b)]
            async with asyncio.timeout(WAIT_SECONDS):
                assert await releases[0] is True
            assert not releases[1].done()  # b's row is still locked
        finally:
            await tx.rollback()
        async with asyncio.timeout(WAIT_SECONDS):
            assert await releases[1] is True
