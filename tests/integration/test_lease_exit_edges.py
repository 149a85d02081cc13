"""What the end of an ``async with lease:`` block may and may not do.

- The release as a block ends is best effort (the lease lapses at its
  expiry otherwise): a release the database refuses (a statement timeout,
  a cancel, a lock timeout while another transaction holds the row) must
  not turn a block that finished into an error.
- A cancellation of the task delivered while the block's exit stops the
  lease's keeper belongs to whoever cancelled the task: it is not swallowed.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from leases import LeaseClient

TTL = 30.0
WAIT_SECONDS = 20.0


async def test_a_refused_release_at_exit_does_not_fail_a_finished_block(
    pool: asyncpg.Pool, admin: asyncpg.Connection, locker: asyncpg.Connection,
) -> None:
    """The release of a block that finished waits on its row (locked by an
    operator's open transaction) and is cancelled (pg_cancel_backend): the
    block still ends without an error, and the lease lapses at its expiry."""
    client = LeaseClient(pool=pool)
    lease = await client.claim("run:exit-refused", ttl=TTL)
    assert lease is not None
    tx = locker.transaction()
    await tx.start()
    try:
        async with lease:
            await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1"
                                 " FOR UPDATE", lease.resource)

            async def cancel_the_release() -> None:
                async with asyncio.timeout(WAIT_SECONDS):
                    while True:
                        pid = await admin.fetchval(
                            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND query LIKE '%fencegate_release_lease%'"
                            " AND pid <> pg_backend_pid() LIMIT 1")
                        if pid is not None:
                            break
                        await asyncio.sleep(0.01)
                assert await admin.fetchval("SELECT pg_cancel_backend($1)", pid)

            canceller = asyncio.get_running_loop().create_task(cancel_the_release())
        await canceller
    finally:
        await tx.rollback()


async def test_a_cancellation_during_the_exit_is_not_swallowed(pool: asyncpg.Pool) -> None:
    """The task is cancelled as its block ends (here by itself, as
    ``asyncio.timeout`` would at that moment): the cancellation comes out of
    the ``async with``, it is not eaten by the stop of the keeper."""
    client = LeaseClient(pool=pool)
    lease = await client.claim("run:exit-cancelled", ttl=TTL)
    assert lease is not None
    went_on = False

    async def body() -> None:
        nonlocal went_on
        async with lease:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # delivered at the next await: the block's exit
        went_on = True
        await asyncio.sleep(0)
        went_on = True

    task = asyncio.get_running_loop().create_task(body())
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(WAIT_SECONDS):
            await task
    assert task.cancelled() and not went_on
