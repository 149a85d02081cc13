"""Waiting for a statement to wait on a lock: the moment a test holds a row
(or a key) and needs the statement under test stuck behind it, seen in
``pg_stat_activity`` rather than guessed with a sleep."""

from __future__ import annotations

import asyncpg

from tests.support.waiting import until

#: backends of this database, other than the one asking, waiting on a lock
#: while they run a statement whose text contains $1
WAITING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
           "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() "
           "AND query LIKE '%' || $1 || '%'")


async def waiting_on_locks(db: asyncpg.Pool | asyncpg.Connection, statement: str) -> int:
    """How many statements containing ``statement`` wait on a lock now."""
    count: int = await db.fetchval(WAITING, statement)
    return count


async def until_waiting(db: asyncpg.Pool | asyncpg.Connection, statement: str,
                        n: int = 1) -> None:
    """Return once ``n`` statements containing ``statement`` wait on a lock
    (``db`` outside a transaction: inside one, pg_stat_activity answers the
    same snapshot every time)."""
    async def enough() -> bool:
        return await waiting_on_locks(db, statement) >= n

    await until(enough, f"{n} statement(s) with {statement!r} waiting on a lock")
