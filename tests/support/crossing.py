"""Effect statements held at one point: a trigger on the ledger's inserts of
the chosen (key, resource) pairs waits for an advisory lock the test holds,
so two batches both stand there, each holding what it took before, until
the test lets them go. What a pause in the trigger only hoped for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import asyncpg

from leases import LeaseClient

#: the advisory lock the held inserts wait for
HOLD_LOCK = 4242


async def claim_fences(pool: asyncpg.Pool, *resources: str) -> dict[str, int]:
    """A live lease on each resource (owner ``worker``); their fences."""
    leases = LeaseClient(pool=pool, owner="worker", timeout=10)
    fences = {}
    for resource in resources:
        lease = await leases.claim(resource, ttl=60)
        assert lease is not None
        fences[resource] = lease.fence
    return fences


async def hold_inserts(pool: asyncpg.Pool, entries: Iterable[tuple[str, str]]) -> None:
    """From now on, an insert into the ledger of one of ``entries`` (key,
    resource) waits, after the row is in, while the test is ``holding``."""
    pairs = ", ".join(f"('{key}', '{resource}')" for key, resource in entries)
    await pool.execute(f"""
        CREATE FUNCTION hold_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_advisory_xact_lock_shared({HOLD_LOCK}); RETURN NULL; END $$;
        CREATE TRIGGER hold_insert AFTER INSERT ON fencegate_effects FOR EACH ROW
          WHEN ((NEW.idempotency_key, NEW.resource) IN ({pairs}))
          EXECUTE FUNCTION hold_insert();""")


@asynccontextmanager
async def holding(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Held inserts wait inside the block; they go on as it ends."""
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    try:
        await holder.execute("SELECT pg_advisory_xact_lock($1)", HOLD_LOCK)
        yield
    finally:
        await tx.commit()  # let them go
        await pool.release(holder)
