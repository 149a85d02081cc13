"""Schema migrations: versioned SQL files, applied once each, under a lock.

Several processes may start at once; a session-level advisory lock makes the
second wait for the first and then find nothing to do. A database migrated by a
newer fencegate is refused rather than used.
"""

from __future__ import annotations

import asyncpg

from . import sql
from .errors import SchemaError, SchemaTooNew

_LOCK_KEY = 0x66656E6365  # "fence": one advisory lock for all migrators

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS fencegate_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""


def latest_version() -> int:
    """The newest schema version this code knows."""
    return sql.migrations()[-1][0]


async def applied_version(conn: asyncpg.Connection) -> int:
    """The database's schema version, 0 when never migrated."""
    exists = await conn.fetchval("SELECT to_regclass('fencegate_migrations') IS NOT NULL")
    if not exists:
        return 0
    return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM fencegate_migrations"))


def check_version(found: int) -> None:
    """Refuse a schema this code is too old or too new for."""
    known = latest_version()
    if found > known:
        raise SchemaTooNew(
            f"the database is at schema version {found}, but this fencegate knows only up to "
            f"{known}: upgrade fencegate before pointing it at this database"
        )
    if found < known:
        raise SchemaError(
            f"the database is at schema version {found}, this fencegate needs {known}: "
            "run `fencegate migrate`"
        )


async def migrate(conn: asyncpg.Connection) -> list[int]:
    """Apply every missing migration; answer the versions applied."""
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(_CREATE_TABLE)
        current = await applied_version(conn)
        if current > latest_version():
            check_version(current)
        applied = []
        for version, name, text in sql.migrations():
            if version <= current:
                continue
            async with conn.transaction():
                await conn.execute(text)
                await conn.execute(
                    "INSERT INTO fencegate_migrations (version, name) VALUES ($1, $2)",
                    version, name,
                )
            applied.append(version)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def migrate_dsn(dsn: str) -> list[int]:
    """Connect to ``dsn`` and migrate it."""
    conn = await asyncpg.connect(dsn)
    try:
        return await migrate(conn)
    finally:
        await conn.close()
