"""The lock order of the effect statements (schema.sql, "the lock order"):
lease rows before keys, and no statement waits for a lease row while it
holds a key; a batch skips held lease rows and takes its keys in
(client, key) order, so two batches never wait for each other's keys.

Here two admission batches share two keys, each under other resources (a
caller reusing keys across resources): batch A admits K on run:1 and J on
run:3, batch B admits J on run:2 and K on run:4. Both are started and held
at the same point (a trigger on their first insert of interest waits for a
lock the test holds), then let go. Taken in resource order, A would hold K
and wait for J while B held J and waited for K: a deadlock, one statement
aborted. Taken in key order, both want J first: one waits for the other,
and both answer."""

from __future__ import annotations

import asyncio

import asyncpg

from leases import LeaseClient
from tests.support.crossing import claim_fences, hold_inserts, holding
from tests.support.locks import until_waiting

ADMIT = """SELECT ord, verdict FROM fencegate_admit_effects(
    $1::text[], $2::text[], $3::bytea[], $4::text[], $5::bigint[], $6::text[],
    $7::bigint[], $8::float8[], $9::float8[], 0)"""


async def test_two_batches_that_share_keys_do_not_deadlock(pool: asyncpg.Pool) -> None:
    fences = await claim_fences(pool, "run:1", "run:2", "run:3", "run:4")
    await hold_inserts(pool, [("K", "run:1"), ("J", "run:2"), ("J", "run:3"), ("K", "run:4")])

    def batch(entries: list[tuple[str, str]], attempt: int) -> list[list[object]]:
        n = len(entries)
        return [["agents"] * n, [k for k, _ in entries], [k.encode() for k, _ in entries],
                [r for _, r in entries], [fences[r] for _, r in entries], ["hook"] * n,
                [attempt + i for i in range(n)], [30.0] * n, [0.0] * n]

    async with holding(pool):
        a = asyncio.ensure_future(pool.fetch(ADMIT, *batch([("K", "run:1"), ("J", "run:3")], 10)))
        b = asyncio.ensure_future(pool.fetch(ADMIT, *batch([("J", "run:2"), ("K", "run:4")], 20)))
        # both statements under way, each waiting on the held lock
        await until_waiting(pool, "fencegate_admit_effects", 2)
    results = await asyncio.gather(a, b, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    verdicts = sorted(row["verdict"] for rows in results for row in rows)  # type: ignore[union-attr]
    # each key admitted once, its other caller told it belongs to another resource
    assert verdicts == ["admitted", "admitted", "idempotency_key_reused",
                        "idempotency_key_reused"], verdicts
    assert await pool.fetchval("SELECT count(*) FROM fencegate_effects") == 2


async def test_a_purge_skips_the_keys_another_statement_holds(pool: asyncpg.Pool) -> None:
    """The purge takes many keys in no order of theirs: it skips a held one
    rather than wait for it (waiting, it could close a cycle with a batch),
    and purges it next time."""
    from gateway.ledger import Ledger

    for key in ("old-1", "old-2"):
        await pool.execute(
            "INSERT INTO fencegate_effects (client, idempotency_key, fingerprint, resource, "
            "fence, provider, state, deadline, response_status, updated_at) VALUES "
            "('agents', $1, 'x', 'run:1', 1, 'hook', 'succeeded', clock_timestamp(), 200, "
            "clock_timestamp() - interval '1 day')", key)
    ledger = Ledger(LeaseClient(pool=pool, timeout=10))
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM fencegate_effects WHERE idempotency_key = 'old-1' "
                           "FOR UPDATE")  # a replay of the key holds it
        assert await asyncio.wait_for(ledger.purge(retention_seconds=60), 30) == 1
    assert await ledger.purge(retention_seconds=60) == 1
    assert await pool.fetchval("SELECT count(*) FROM fencegate_effects") == 0
