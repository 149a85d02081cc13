"""The outcome writer's drain at shutdown waits, up to its timeout, for every
record queued, the one already taken into a statement included: a caller that
had its 200 gets the replay on a repeat of the key, never 409."""

from __future__ import annotations

import asyncio

import asyncpg

from gateway.ledger import Ledger, StoredAnswer, new_attempt
from leases import LeaseClient
from tests.support.waiting import until


async def test_drain_waits_for_the_record_being_written(pool: asyncpg.Pool) -> None:
    leases = LeaseClient(pool=pool, owner="worker", timeout=10)
    lease = await leases.claim("run:drain", ttl=60)
    assert lease is not None
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=30))
    attempt = new_attempt()
    admission = await ledger.admit("agents", "k", b"k", "run:drain", lease.fence, "hook",
                                   attempt, 5.0, 0.0)
    assert admission.verdict == "admitted"

    locker = await pool.acquire()
    tx = locker.transaction()
    await tx.start()
    try:  # the lease row is held elsewhere for 0.3 s
        await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = 'run:drain' "
                             "FOR NO KEY UPDATE")
        ledger.finish("agents", "k", attempt, "run:drain", "succeeded",
                      StoredAnswer(200, {"Content-Type": "text/plain"}, b"ok"), "http 200")
        # the writer has sent the record; it waits for the row
        await until(lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> $1", locker.get_server_pid()),
            "the record's statement waiting on the row lock")
        drained = asyncio.ensure_future(ledger.drain())  # shutdown, with 30 s to spare
        # the drain is under way while the row is held: a slow machine only
        # lengthens this, within the drain's 30 s (the wait that must not end early)
        await asyncio.sleep(0.3)
        assert not drained.done()
    finally:
        await tx.rollback()
        await pool.release(locker)
    await drained

    state = await pool.fetchval("SELECT state FROM fencegate_effects "
                                "WHERE idempotency_key = 'k'")
    assert state == "succeeded", "drain cancelled the record it should have waited for"
