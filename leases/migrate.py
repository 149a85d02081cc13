"""Schema migrations: versioned SQL files, applied once each, under a lock.

Several processes may start at once; a session-level advisory lock makes the
second wait for the first and then find nothing to do.

Until the first release the schema is one migration, ``0001_baseline.sql``,
changed in place; after it every change is a new migration, one step from
the baseline, and a migration that has left the repository is never edited:
each one's checksum is kept beside it, and a database whose applied
migrations differ from this code's files (an edited migration, or a pre-
release database made before the baseline) is refused with what to do,
rather than migrated into something nobody wrote.

Rolling upgrades: a migration is additive unless its file says otherwise
(a line ``-- fencegate: breaks older code``): it adds tables, columns and
functions, and keeps what older code calls. So a fencegate keeps working on a
schema newer than its own, and stays ready while the new version rolls out
(migrate first, then replace the processes). A schema that a breaking
migration has passed is refused by every older fencegate, at start and in
``/readyz``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import asyncpg

from . import database, sql
from .errors import SchemaError, SchemaTooNew

_LOCK_KEY = 0x66656E6365  # "fence": one advisory lock for all migrators

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS fencegate_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
ALTER TABLE fencegate_migrations ADD COLUMN IF NOT EXISTS breaking boolean NOT NULL
    DEFAULT false;
ALTER TABLE fencegate_migrations ADD COLUMN IF NOT EXISTS checksum text;
"""
_BREAKING = re.compile(r"^-- fencegate: breaks older code\s*$", re.MULTILINE)


def checksum(text: str) -> str:
    """A migration's checksum: sha256 of its text."""
    return hashlib.sha256(text.encode()).hexdigest()


def mismatches(applied: list[tuple[int, str, str | None]],
               known: list[tuple[int, str, str]]) -> str | None:
    """Why the migrations a database applied (``(version, name, checksum)``)
    are not this code's files (``(version, name, sql)``); None when each
    applied one this code knows is the same file. Pure."""
    files = {v: (n, checksum(t)) for v, n, t in known}
    for version, name, digest in applied:
        if version not in files:
            continue  # newer than this code: usable() decides
        if digest is None or files[version][0] != name:
            return (f"the database's schema was made by a pre-release fencegate (its "
                    f"migration {version} is {name!r}, before the baseline): it cannot be "
                    "upgraded in place. An embedded dev database holds only local data: "
                    "delete its folder (.fencegate/pgdata) and run again; otherwise dump the "
                    "data you need and migrate an empty database")
        if digest != files[version][1]:
            return (f"migration {version} ({name}) differs from the one this database "
                    "applied: a migration is never edited once it has been released (add a "
                    "new one instead). Before the first release the baseline changes in "
                    "place: an embedded dev database holds only local data, delete its "
                    "folder (.fencegate/pgdata) and run again")
    return None


async def check_applied(conn: asyncpg.Connection) -> None:
    """``SchemaError`` when the database applied migrations this code's files
    do not match (``mismatches``)."""
    has_checksum = await conn.fetchval(
        "SELECT count(*) > 0 FROM information_schema.columns "
        "WHERE table_name = 'fencegate_migrations' AND column_name = 'checksum'")
    rows = await conn.fetch(
        "SELECT version, name, " + ("checksum" if has_checksum else "NULL::text")
        + " FROM fencegate_migrations ORDER BY version")
    why = mismatches([(r[0], r[1], r[2]) for r in rows], sql.migrations())
    if why is not None:
        raise SchemaError(why)


def latest_version() -> int:
    """The newest schema version this code knows."""
    return sql.migrations()[-1][0]


@dataclass(frozen=True)
class SchemaState:
    """What a database's migrations table says."""

    version: int  #: the newest migration applied (0: none)
    breaking: int  #: the newest breaking one (0: none)


async def schema_state(conn: asyncpg.Connection) -> SchemaState:
    exists = await conn.fetchval("SELECT to_regclass('fencegate_migrations') IS NOT NULL")
    if not exists:
        return SchemaState(0, 0)
    has_breaking = await conn.fetchval(
        "SELECT count(*) > 0 FROM information_schema.columns "
        "WHERE table_name = 'fencegate_migrations' AND column_name = 'breaking'")
    row = await conn.fetchrow(
        "SELECT coalesce(max(version), 0) AS v, "
        + ("coalesce(max(version) FILTER (WHERE breaking), 0)" if has_breaking else "0")
        + " AS b FROM fencegate_migrations")
    return SchemaState(int(row["v"]), int(row["b"]))


def usable(state: SchemaState, known: int) -> str | None:
    """Why this code, which knows migrations up to ``known``, cannot run on a
    schema in ``state``; None when it can. Pure."""
    if state.version < known:
        return (f"the database is at schema version {state.version}, this fencegate needs "
                f"{known}: run `fencegate migrate`")
    if state.breaking > known:
        return (f"the database is at schema version {state.version}, and migration "
                f"{state.breaking} is not compatible with this fencegate (it knows only up "
                f"to {known}): upgrade fencegate before pointing it at this database")
    return None


def check_version(state: SchemaState) -> None:
    """Refuse a schema this code is too old or too new for."""
    why = usable(state, latest_version())
    if why is not None:
        raise (SchemaTooNew if state.version > latest_version() else SchemaError)(why)


async def migrate(conn: asyncpg.Connection) -> list[int]:
    """Apply every missing migration; answer the versions applied."""
    # Up to date (every gateway start but the first after an upgrade): done,
    # without the session advisory lock. Through a transaction-mode pooler
    # (PgBouncer) the lock, the work and the unlock can land on three server
    # connections; the lock then stays on one of them, and every later
    # migrator routed elsewhere waits for it forever. Reading the version
    # needs no lock: no migrator makes it go down.
    state = await schema_state(conn)
    if state.version >= latest_version():
        await check_applied(conn)
        check_version(state)
        return []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(_CREATE_TABLE)
        await check_applied(conn)
        state = await schema_state(conn)
        if state.version > latest_version():
            check_version(state)  # newer, but compatible: nothing to do
            return []
        applied = []
        for version, name, text in sql.migrations():
            if version <= state.version:
                continue
            async with conn.transaction():
                await conn.execute(text)
                await conn.execute(
                    "INSERT INTO fencegate_migrations (version, name, breaking, checksum) "
                    "VALUES ($1, $2, $3, $4)", version, name, bool(_BREAKING.search(text)),
                    checksum(text),
                )
            applied.append(version)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def migrate_dsn(dsn: str) -> list[int]:
    """Connect to ``dsn`` and migrate it."""
    conn = await database.connect(dsn)
    try:
        return await migrate(conn)
    finally:
        await conn.close()
