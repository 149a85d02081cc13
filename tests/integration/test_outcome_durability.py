"""Which ends of attempts may commit without waiting for the WAL flush
(fencegate_finish_effect(s), ``synchronous_commit``).

A free is awaited before its answer ("the key is free again", 502, 429,
the retry right after it finds the key free): it commits as durably as the
admission did (the session's, the server's ``synchronous_commit``), so a
crash after the answer cannot bring back an in-flight row the caller was
told is gone. Every other end (succeeded, failed, unknown) is written
behind its answer and may commit asynchronously: a crash that loses it
leaves the row its admission committed, in flight, then unknown, never
sent again, which is also what a gateway that dies before writing it
leaves. A batch with one free in it commits durably."""

from __future__ import annotations

import asyncpg

from gateway.ledger import Ledger, new_attempt
from leases import LeaseClient

FINISH = ("SELECT fencegate_finish_effect('agents', $1, $2, 'run:d', $3, $4, '{}', 'ok', "
          "'summary')")
FINISH_BATCH = ("SELECT count(*) FROM fencegate_finish_effects($1::text[], $2::text[], "
                "$3::bigint[], $4::text[], $5::text[], $6::int[], $7::jsonb[], $8::bytea[], "
                "$9::text[])")


async def _admit(pool: asyncpg.Pool, ledger: Ledger, fence: int, key: str) -> int:
    attempt = new_attempt()
    admission = await ledger.admit("agents", key, key.encode(), "run:d", fence, "hook",
                                   attempt, 60.0, 0.0)
    assert admission.verdict == "admitted"
    return attempt


async def _commit_setting(conn: asyncpg.Connection, session: str, query: str,
                          *args: object) -> str:
    """The ``synchronous_commit`` the statement leaves in force for its commit."""
    await conn.execute(f"SET synchronous_commit = '{session}'")
    async with conn.transaction():
        await conn.fetchval(query, *args)
        setting: str = await conn.fetchval("SELECT current_setting('synchronous_commit')")
    return setting


async def test_a_free_commits_durably_every_other_end_need_not(pool: asyncpg.Pool) -> None:
    lease = await LeaseClient(pool=pool, owner="worker").claim("run:d", ttl=120)
    assert lease is not None
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10))
    async with pool.acquire() as conn:
        for state, status in (("succeeded", 200), ("failed", 422), ("unknown", None)):
            attempt = await _admit(pool, ledger, lease.fence, state)
            assert await _commit_setting(conn, "on", FINISH, state, attempt, state,
                                         status) == "off", state
        for session in ("on", "remote_apply"):  # the session's own, not a fixed one
            attempt = await _admit(pool, ledger, lease.fence, f"free-{session}")
            assert await _commit_setting(conn, session, FINISH, f"free-{session}", attempt,
                                         "free", None) == session

        def batch(states: list[str], attempts: list[int]) -> list[object]:
            n = len(states)
            return [["agents"] * n, [f"b-{s}" for s in states], attempts, ["run:d"] * n,
                    states, [None if s in ("free", "unknown") else 200 for s in states],
                    ["{}"] * n, [b"ok"] * n, ["summary"] * n]

        behind = ["succeeded", "unknown"]
        attempts = [await _admit(pool, ledger, lease.fence, f"b-{s}") for s in behind]
        assert await _commit_setting(conn, "on", FINISH_BATCH, *batch(behind, attempts)) \
            == "off"
        mixed = ["failed", "free"]
        attempts = [await _admit(pool, ledger, lease.fence, f"b-{s}") for s in mixed]
        assert await _commit_setting(conn, "on", FINISH_BATCH,
                                     *batch(mixed, attempts)) == "on"
        assert await pool.fetchval("SELECT count(*) FROM fencegate_effects "
                                   "WHERE idempotency_key LIKE 'b-%'") == 3  # b-free went


async def test_a_free_is_flushed_before_its_caller_hears_of_it(pool: asyncpg.Pool) -> None:
    lease = await LeaseClient(pool=pool, owner="worker").claim("run:d", ttl=120)
    assert lease is not None
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10))
    attempt = await _admit(pool, ledger, lease.fence, "k")
    async with pool.acquire() as conn:
        await conn.execute("SET synchronous_commit = on")
        tx = conn.transaction()
        await tx.start()
        assert await conn.fetchval(FINISH, "k", attempt, "free", None) == "free"
        before_commit = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        await tx.commit()
        # the commit record lies past before_commit; a durable commit has
        # flushed it by the time it returns
        assert await conn.fetchval("SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn",
                                   before_commit)
