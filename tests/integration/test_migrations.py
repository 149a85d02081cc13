"""Migrations on a real PostgreSQL: each one's checksum is kept, and a
database whose applied migrations are not this code's (an edited file, a
pre-release schema) is refused at migrate and at start, never migrated."""

from __future__ import annotations

import asyncpg
import pytest

from leases import migrate
from leases.errors import SchemaError


async def test_checksums_are_kept_and_an_edited_migration_is_refused(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT version, checksum FROM fencegate_migrations")
        files = {v: migrate.checksum(t) for v, _, t in migrate.sql.migrations()}
        assert {r["version"]: r["checksum"] for r in rows} == files
        assert await migrate.migrate(conn) == []  # up to date: nothing to do
        await conn.execute("UPDATE fencegate_migrations SET checksum = 'edited' "
                           "WHERE version = 1")
        with pytest.raises(SchemaError, match="never edited"):
            await migrate.migrate(conn)
    finally:
        await conn.close()


async def test_a_pre_release_schema_is_refused(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:  # as a database made before the baseline records its first step
        await conn.execute("UPDATE fencegate_migrations SET name = 'leases', checksum = NULL "
                           "WHERE version = 1")
        with pytest.raises(SchemaError, match="pre-release"):
            await migrate.migrate(conn)
    finally:
        await conn.close()
