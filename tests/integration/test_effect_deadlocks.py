"""A deadlock PostgreSQL breaks by aborting the gateway's batch statement is
answered: the batch committed nothing, its entries go again one at a time,
and every caller gets its verdict, every outcome lands, once.

Batches of the gateway cannot deadlock with each other (test_effect_lock_order);
a transaction of another kind still can, here one that holds a key the batch
wants and then wants a key the batch holds. It waits longer before checking
for a deadlock (deadlock_timeout), so the batch is the statement aborted."""

from __future__ import annotations

import asyncio

import asyncpg

from gateway.ledger import Ledger, StoredAnswer, new_attempt
from leases import LeaseClient
from tests.support.locks import until_waiting


async def _setup(pool: asyncpg.Pool) -> tuple[Ledger, dict[str, int]]:
    fences = {}
    for r in ("run:a", "run:z"):
        lease = await LeaseClient(pool=pool, owner="worker").claim(r, ttl=120)
        assert lease is not None
        fences[r] = lease.fence
    return Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10)), fences


async def _other(pool: asyncpg.Pool) -> tuple[asyncpg.Connection, asyncpg.transaction.Transaction]:
    conn = await pool.acquire()
    tx = conn.transaction()
    await tx.start()
    await conn.execute("SET LOCAL deadlock_timeout = '10min'")
    return conn, tx


async def _close_the_cycle(pool: asyncpg.Pool, conn: asyncpg.Connection, batch: str,
                           statement: str) -> None:
    """The batch statement ``batch`` holds A and waits for Z (``conn``
    holds it); ``statement`` on ``conn`` then waits for A: a cycle, which the
    batch's backend finds first and breaks by aborting the batch. Once the
    batch's entries go again alone (the one for Z waits again), ``statement``
    is withdrawn."""
    await until_waiting(pool, f"{batch}s(")  # holds A, waits for Z
    other = asyncio.ensure_future(conn.execute(statement))
    await until_waiting(pool, f"{batch}(")  # alone now, waiting
    other.cancel()
    await asyncio.gather(other, return_exceptions=True)


async def test_an_admission_batch_aborted_by_a_deadlock_answers_every_caller(
    pool: asyncpg.Pool,
) -> None:
    ledger, fences = await _setup(pool)
    z = new_attempt()
    assert (await ledger.admit("agents", "Z", b"Z", "run:z", fences["run:z"], "hook", z,
                               60.0, 0.0)).verdict == "admitted"
    conn, tx = await _other(pool)
    try:
        await conn.execute("SELECT 1 FROM fencegate_effects WHERE idempotency_key = 'Z' "
                           "FOR UPDATE")
        calls = [asyncio.ensure_future(ledger.admit(
            "agents", key, key.encode(), resource, fences[resource], "hook", new_attempt(),
            60.0, 0.0)) for key, resource in (("A", "run:a"), ("Z", "run:z"))]
        await _close_the_cycle(
            pool, conn, "fencegate_admit_effect",
            "INSERT INTO fencegate_effects (client, idempotency_key, fingerprint, resource, "
            "fence, provider, state, deadline) VALUES ('agents', 'A', 'A', 'run:a', 1, "
            "'hook', 'in_flight', clock_timestamp())")
    finally:
        await tx.rollback()
        await pool.release(conn)
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [getattr(r, "verdict", r) for r in results] == ["admitted", "effect_in_progress"]
    assert await pool.fetchval("SELECT inflight FROM fencegate_leases "
                               "WHERE resource = 'run:a'") == 1


async def test_a_finish_batch_aborted_by_a_deadlock_records_every_outcome(
    pool: asyncpg.Pool,
) -> None:
    ledger, fences = await _setup(pool)
    attempts = {}
    for key, resource in (("A", "run:a"), ("Z", "run:z")):
        attempts[key] = new_attempt()
        assert (await ledger.admit("agents", key, key.encode(), resource, fences[resource],
                                   "hook", attempts[key], 60.0, 0.0)).verdict == "admitted"
    conn, tx = await _other(pool)
    try:
        await conn.execute("SELECT 1 FROM fencegate_effects WHERE idempotency_key = 'Z' "
                           "FOR UPDATE")
        for key, resource in (("A", "run:a"), ("Z", "run:z")):  # one batch: A, then Z
            ledger.finish("agents", key, attempts[key], resource, "succeeded",
                          StoredAnswer(200, {}, b"ok"), "http 200")
        await _close_the_cycle(
            pool, conn, "fencegate_finish_effect",
            "UPDATE fencegate_effects SET summary = 'other' WHERE idempotency_key = 'A'")
    finally:
        await tx.rollback()
        await pool.release(conn)
    await ledger.drain()
    rows = await pool.fetch("SELECT idempotency_key, state, summary FROM fencegate_effects "
                            "ORDER BY 1")
    assert [tuple(r) for r in rows] == [("A", "succeeded", "http 200"),
                                        ("Z", "succeeded", "http 200")]
    assert await pool.fetchval("SELECT sum(inflight) FROM fencegate_leases") == 0
