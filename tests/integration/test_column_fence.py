"""The storage-side fence (leases/column_fence.py) on a real PostgreSQL:
writers with older fences race newer ones on the same rows, from real
processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time

import asyncpg

from leases.column_fence import fenced_write

TABLE = """
CREATE TABLE accounts (id int PRIMARY KEY, value text NOT NULL, fence bigint NOT NULL);
-- every write that landed, in the order it landed: the row lock orders them,
-- and the sequence is taken under it
CREATE TABLE landed (seq bigserial PRIMARY KEY, id int NOT NULL, fence bigint NOT NULL,
                     value text NOT NULL);
CREATE FUNCTION record_landed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO landed (id, fence, value) VALUES (NEW.id, NEW.fence, NEW.value);
    RETURN NEW;
END $$;
CREATE TRIGGER landed AFTER INSERT OR UPDATE ON accounts
    FOR EACH ROW EXECUTE FUNCTION record_landed();
"""


async def test_a_write_lands_under_the_same_or_a_newer_fence_only(pool: asyncpg.Pool) -> None:
    await pool.execute(TABLE)
    assert await fenced_write(pool, "accounts", "id", 1, {"value": "a"}, 5)
    assert await fenced_write(pool, "accounts", "id", 1, {"value": "b"}, 5)  # the holder again
    assert not await fenced_write(pool, "accounts", "id", 1, {"value": "zombie"}, 4)
    assert await fenced_write(pool, "accounts", "id", 1, {"value": "c"}, 6, insert=False)
    assert not await fenced_write(pool, "accounts", "id", 1, {"value": "z"}, 5, insert=False)
    assert not await fenced_write(pool, "accounts", "id", 2, {"value": "x"}, 9, insert=False)
    assert tuple(await pool.fetchrow("SELECT value, fence FROM accounts")) == ("c", 6)


async def test_a_newer_fence_waits_for_an_older_ones_open_transaction(
    pool: asyncpg.Pool,
) -> None:
    """In the caller's transaction the row stays locked: the newer write
    lands after the older one commits, never under it."""
    await pool.execute(TABLE)
    async with pool.acquire() as old, pool.acquire() as new:
        tx = old.transaction()
        await tx.start()
        assert await fenced_write(old, "accounts", "id", 1, {"value": "old"}, 1)
        newer = asyncio.create_task(fenced_write(new, "accounts", "id", 1, {"value": "new"}, 2))
        while not await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"):
            await asyncio.sleep(0.01)
        await tx.commit()
        assert await newer
    assert [tuple(r) for r in await pool.fetch("SELECT fence, value FROM landed ORDER BY seq")] \
        == [(1, "old"), (2, "new")]


ROWS = 60
WRITES = 3  # each writer writes each row this many times
FENCES = (1, 2, 3)  # a zombie, the holder after it, and the newest holder


def _writer(dsn: str, fence: int, start_at: float,
            out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def main() -> dict[int, list[bool]]:
        conn = await asyncpg.connect(dsn)
        results: dict[int, list[bool]] = {}
        order = [(row, n) for row in range(ROWS) for n in range(WRITES)]
        random.Random(fence).shuffle(order)
        order.sort(key=lambda w: w[1])  # each row's writes in order, rows shuffled
        try:
            while time.time() < start_at:
                await asyncio.sleep(0.001)
            for row, n in order:
                ok = await fenced_write(conn, "accounts", "id", row, {"value": f"{fence}:{n}"},
                                        fence, insert=row % 2 == 0)
                results.setdefault(row, []).append(ok)
        finally:
            await conn.close()
        return results

    out.put((fence, asyncio.run(main())))


async def test_processes_with_older_fences_never_write_after_a_newer_one(
    pool: asyncpg.Pool, dsn: str,
) -> None:
    """Three processes, one fence each, write the same rows at once (upserts
    on even rows, updates of existing rows on odd ones). Per row: the writes
    that landed have fences that never go down, the row ends with the newest
    fence's last value, and a writer once refused is refused after."""
    await pool.execute(TABLE)
    await pool.executemany("INSERT INTO accounts VALUES ($1, 'seed', 0)",
                           [(row,) for row in range(1, ROWS, 2)])
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 2.0  # after every child has imported and connected
    procs = [ctx.Process(target=_writer, args=(dsn, fence, start_at, out)) for fence in FENCES]
    for p in procs:
        p.start()
    results = dict(await asyncio.to_thread(lambda: [out.get(timeout=90) for _ in procs]))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    landed = await pool.fetch("SELECT id, fence, value FROM landed WHERE value <> 'seed' "
                              "ORDER BY seq")
    for row in range(ROWS):
        fences = [r["fence"] for r in landed if r["id"] == row]
        assert fences == sorted(fences), f"row {row}: an older fence landed late: {fences}"
        for fence in FENCES:
            outcomes = results[fence][row]
            assert outcomes == sorted(outcomes, reverse=True), (row, fence, outcomes)
        assert results[max(FENCES)][row] == [True] * WRITES
    final = {r["id"]: (r["fence"], r["value"]) for r in await pool.fetch("SELECT * FROM accounts")}
    assert final == {row: (3, f"3:{WRITES - 1}") for row in range(ROWS)}
    # the race happened: older fences both landed and were refused
    older = [ok for fence in FENCES[:-1] for row in range(ROWS) for ok in results[fence][row]]
    assert any(older) and not all(older)
