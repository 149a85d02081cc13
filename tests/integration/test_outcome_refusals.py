"""Recording the end of an attempt survives the database refusing the
statement (gateway/ledger.py: ``OutcomeWriter``, ``Ledger._free_unsent``).

A refusal (the statement cancelled by ``pg_cancel_backend`` or by the pool's
``statement_timeout``, a deadlock, a serialisation failure) committed
nothing, so the record is tried again, as one that got no answer is, until
``RECORD_RETRY_SECONDS``: dropped, the effect would stay in flight with its
place in the lease's drain barrier until its deadline, then read unknown
though its outcome was known. Tried again, it still counts once (its nonce).
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from gateway.ledger import Ledger, StoredAnswer, new_attempt
from leases import LeaseClient

WAITING = """SELECT (pid, query_start) FROM pg_stat_activity
               WHERE datname = current_database() AND wait_event_type = 'Lock'
                 AND query LIKE '%fencegate_finish_effect%'"""


async def _wait_for(pool: asyncpg.Pool, query: str, *args: object,
                    bound: float = 30.0) -> object:
    """The first non-null value ``query`` answers, polled (a generous bound)."""
    give_up = time.monotonic() + bound
    while time.monotonic() < give_up:
        value = await pool.fetchval(query, *args)
        if value is not None:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {bound} s: {query}")


async def _admitted(pool: asyncpg.Pool, ledger: Ledger, resource: str, key: str) -> int:
    lease = await LeaseClient(pool=pool, owner="worker", timeout=10).claim(resource, ttl=120)
    assert lease is not None
    attempt = new_attempt()
    admission = await ledger.admit("agents", key, key.encode(), resource, lease.fence,
                                   "hook", attempt, 60.0, 0.0)
    assert admission.verdict == "admitted"
    return attempt


async def _cancel_the_waiting_record(pool: asyncpg.Pool, resource: str) -> None:
    """Hold ``resource``'s lease row until the record waits for it, cancel
    that statement (a refusal: query_canceled), and let the row go once the
    cancel has ended it."""
    locker = await pool.acquire()
    tx = locker.transaction()
    await tx.start()
    try:
        await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1 "
                             "FOR NO KEY UPDATE", resource)
        pid, started = await _wait_for(pool, WAITING)  # type: ignore[misc]
        assert await pool.fetchval("SELECT pg_cancel_backend($1)", pid)
        # that statement is over (another may wait on the same connection since)
        await _wait_for(pool, "SELECT true WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity "
                        "WHERE pid = $1 AND query_start = $2 AND wait_event_type = 'Lock')",
                        pid, started)
    finally:
        await tx.rollback()
        await pool.release(locker)


async def _effect(pool: asyncpg.Pool, key: str) -> tuple[object, ...] | None:
    row = await pool.fetchrow(
        "SELECT e.state, e.attempt, l.inflight FROM fencegate_effects e "
        "JOIN fencegate_leases l USING (resource) WHERE e.idempotency_key = $1", key)
    return None if row is None else tuple(row)


async def test_an_outcome_whose_statement_was_cancelled_is_recorded(
    pool: asyncpg.Pool,
) -> None:
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10))
    attempt = await _admitted(pool, ledger, "run:cancel", "k")
    ledger.finish("agents", "k", attempt, "run:cancel", "succeeded",
                  StoredAnswer(200, {"Content-Type": "text/plain"}, b"ok"), "http 200")
    await _cancel_the_waiting_record(pool, "run:cancel")
    await ledger.drain()  # waits (up to the timeout) for the record to land
    # recorded, once: its place in the drain barrier given back exactly once
    assert await _effect(pool, "k") == ("succeeded", None, 0)
    assert await pool.fetchval("SELECT fencegate_finish_effect('agents', 'k', $1, "
                               "'run:cancel', 'succeeded', 200, '{}', 'ok', 'again')",
                               attempt) == "gone"


async def test_a_free_of_an_unanswered_admission_survives_a_cancelled_statement(
    pool: asyncpg.Pool,
) -> None:
    # timeout 5: its tries come at once, then 5 s and 12.5 s later (at 1 s, a
    # loaded machine could spend all three before the lock was let go)
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=5))
    attempt = await _admitted(pool, ledger, "run:unsent", "u")
    ledger.free_unsent("agents", "u", attempt, "run:unsent")
    await _cancel_the_waiting_record(pool, "run:unsent")
    tasks = set(ledger._background)
    done, _ = await asyncio.wait(tasks, timeout=90)
    assert done == tasks
    assert [t.exception() for t in done] == [None]
    # freed: the key is free again, and the lease's drain barrier released
    assert await _effect(pool, "u") is None
    assert await pool.fetchval("SELECT inflight FROM fencegate_leases "
                               "WHERE resource = 'run:unsent'") == 0
