"""A zombie's fenced transaction racing the next claim, in real processes.

The invariant (CONTRACT.md, "Fenced writes in your own transaction"): a write
committed in a transaction that passed ``fencegate_check_fence(resource, f)``
commits while ``f`` is still the resource's current fence. No newer fence is
granted while such a transaction is open, however long it stays open past its
lease's expiry; so by commit order, the fences of committed writes never go
back."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from typing import Any

import asyncpg

from leases import LeaseClient

PROCESSES = 4
#: fenced transactions each process makes (each a claim it won)
WINS = 100
TTL = 0.05  # the shortest ttl a lease may have
RESOURCE = "acct:race"

#: checked as each writing transaction commits, under every lock it holds: a
#: deferred constraint trigger sees the lease row as the commit does. It
#: records the commit's order; and a fence no longer current fails the commit
#: with FGX01, which the workers count as an overlap.
SCHEMA = """
CREATE TABLE fenced_writes (id bigint GENERATED ALWAYS AS IDENTITY, fence bigint NOT NULL);
CREATE TABLE fenced_commits (seq bigint GENERATED ALWAYS AS IDENTITY, fence bigint NOT NULL);
CREATE FUNCTION fenced_writes_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT fence FROM fencegate_leases WHERE resource = 'acct:race') <> NEW.fence THEN
        RAISE EXCEPTION USING ERRCODE = 'FGX01', MESSAGE = 'overlap';
    END IF;
    INSERT INTO fenced_commits (fence) VALUES (NEW.fence);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fenced_writes_at_commit AFTER INSERT ON fenced_writes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fenced_writes_at_commit();
"""


def _rounds(dsn: str, owner: str, seed: int, start: Any, out: Any) -> None:
    async def main() -> dict[str, int]:
        rng = random.Random(seed)
        counts = {"lost": 0, "committed": 0, "refused": 0, "overlap": 0, "ended": 0}
        client = LeaseClient(dsn, owner=owner, pool_size=2)
        conn = await asyncpg.connect(dsn)
        try:
            await client.connect()
            start.wait()
            while counts["committed"] + counts["refused"] + counts["ended"] \
                    + counts["overlap"] < WINS:
                lease = await client.claim(RESOURCE, ttl=TTL)
                if lease is None:
                    counts["lost"] += 1
                    await asyncio.sleep(rng.random() * 0.005)
                    continue
                # sometimes a stall before the check, sometimes inside the
                # transaction, all past the lease's ttl and never renewed:
                # working (a slow statement) or idle (the worker paused, which
                # the server ends once the lease's time has passed)
                before, working, idle = rng.choice(
                    [(0, 0, 0), (0, 0, 0), (TTL * 2, 0, 0), (0, TTL * 2, 0), (0, 0, TTL * 2)])
                await asyncio.sleep(before)
                try:
                    async with conn.transaction():
                        await conn.execute("SELECT fencegate_check_fence($1, $2)",
                                           RESOURCE, lease.fence)
                        await conn.execute("INSERT INTO fenced_writes (fence) VALUES ($1)",
                                           lease.fence)
                        await conn.execute("SELECT pg_sleep($1)", working)
                        await asyncio.sleep(idle)
                    counts["committed"] += 1
                except (asyncpg.InterfaceError, asyncpg.ConnectionDoesNotExistError,
                        asyncpg.IdleInTransactionSessionTimeoutError):
                    counts["ended"] += 1  # its transaction rolled back with the session
                    conn.terminate()
                    conn = await asyncpg.connect(dsn)
                except asyncpg.PostgresError as e:
                    if e.sqlstate == "FG412":
                        counts["refused"] += 1
                    elif e.sqlstate == "FGX01":
                        counts["overlap"] += 1
                    else:
                        raise
        finally:
            await conn.close()
            await client.close()
        return counts

    try:
        out.put(asyncio.run(main()))
    except BaseException as e:  # the parent fails with it, rather than wait
        out.put({"error": repr(e)})
        raise


async def test_no_committed_write_under_a_fence_older_than_one_granted(dsn: str) -> None:
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute(SCHEMA)
    finally:
        await setup.close()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Barrier(PROCESSES)
    procs = [ctx.Process(target=_rounds, args=(dsn, f"p{i}", i, start, out))
             for i in range(PROCESSES)]
    for p in procs:
        p.start()
    totals: dict[str, int] = {}
    for _ in procs:
        counts = await asyncio.to_thread(out.get, timeout=600)
        assert "error" not in counts, counts["error"]
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
    for p in procs:
        await asyncio.to_thread(p.join, 60)
        assert p.exitcode == 0
    assert totals["overlap"] == 0, totals
    # a check after a stall past the ttl is always refused; a prompt one commits
    assert totals["refused"] > 0 and totals["committed"] > 0, totals
    check = await asyncpg.connect(dsn)
    try:
        fences = [r["fence"] for r in await check.fetch(
            "SELECT fence FROM fenced_commits ORDER BY seq")]
        written = await check.fetchval("SELECT count(*) FROM fenced_writes")
    finally:
        await check.close()
    assert len(fences) == written == totals["committed"]
    assert fences == sorted(fences), "a write committed under a fence older than one before it"
