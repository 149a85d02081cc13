"""schema.sql says what the migrations build, and every statement the code
runs exists: the SQL has one readable home that cannot drift."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import asyncpg

from leases import database, sql

ROOT = Path(__file__).resolve().parents[2]
#: per session: two test runs at once share the server
SCHEMA_SQL_DB = f"fg_test_{os.getpid()}_schema_sql"


def _normalised(source: str) -> str:
    """A function body without comments or layout."""
    return " ".join(re.sub(r"--[^\n]*", "", source).split())


async def describe(conn: asyncpg.Connection) -> dict[str, Any]:
    """Everything fencegate defines in a database, in a comparable form."""
    tables = await conn.fetch("""
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid)
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relname LIKE 'fencegate\\_%' AND c.relname <> 'fencegate_migrations'
           AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped""")
    constraints = await conn.fetch("""
        SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
          FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
         WHERE c.relname LIKE 'fencegate\\_%' AND c.relname <> 'fencegate_migrations'""")
    indexes = await conn.fetch("""
        SELECT indexname, indexdef FROM pg_indexes
         WHERE tablename LIKE 'fencegate\\_%' AND tablename <> 'fencegate_migrations'""")
    functions = await conn.fetch("""
        SELECT proname, pg_get_function_identity_arguments(oid), pg_get_function_result(oid),
               prosrc, provolatile, prorows, coalesce(proconfig, '{}')
          FROM pg_proc WHERE proname LIKE 'fencegate\\_%'""")
    triggers = await conn.fetch("""
        SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger
         WHERE tgname LIKE 'fencegate\\_%' AND NOT tgisinternal""")
    return {
        "columns": sorted(tuple(r) for r in tables),
        "constraints": sorted(tuple(r) for r in constraints),
        "indexes": sorted(tuple(r) for r in indexes),
        # proconfig: a function's SET clauses (fencegate_lock_completions
        # keeps its generic plans), which the body alone does not show
        "functions": sorted((r[0], r[1], r[2], _normalised(r[3]), r[4], r[5], tuple(r[6]))
                            for r in functions),
        "triggers": sorted(tuple(r) for r in triggers),
    }


async def test_schema_sql_is_what_the_migrations_build(dsn: str, template_ready: str) -> None:
    admin = await asyncpg.connect(template_ready)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{SCHEMA_SQL_DB}"')
        await admin.execute(f'CREATE DATABASE "{SCHEMA_SQL_DB}"')
    finally:
        await admin.close()
    migrated = await asyncpg.connect(dsn)
    written = await asyncpg.connect(database.with_database(template_ready, SCHEMA_SQL_DB))
    try:
        await written.execute((ROOT / "leases" / "sql" / "schema.sql").read_text())
        built, said = await describe(migrated), await describe(written)
        for part in built:
            only_built = sorted(x[:2] for x in set(built[part]) - set(said[part]))
            only_said = sorted(x[:2] for x in set(said[part]) - set(built[part]))
            assert built[part] == said[part], (
                f"schema.sql and the migrations differ in their {part}: as the migrations "
                f"build them {only_built}, as schema.sql says {only_said}")
        assert built["functions"] and built["columns"]
    finally:
        await migrated.close()
        await written.close()


def test_every_statement_the_code_names_exists() -> None:
    """Every ``sql.query("x")``, and every named statement run through a
    LeaseClient (``.fetch("x", ...)`` and its kin), names a statement of the
    sql files; and every statement there is used."""
    used: set[str] = set()
    pattern = re.compile(r"""(?:sql\.query|\.fetch|\.fetch_keeping|\.fetchrow|\.fetchval
                                |\.execute)\(\s*"([a-z_]+)"[,)]""", re.VERBOSE)
    for package in ("leases", "gateway", "bench", "deploy"):
        for path in (ROOT / package).rglob("*.py"):
            used |= set(pattern.findall(path.read_text()))
    for name in ("resolve_effect_sent", "resolve_effect_not_sent"):  # named by a conditional
        used.add(name)
    assert used <= sql.names(), f"no such statement: {sorted(used - sql.names())}"
    assert sql.names() <= used, f"never used: {sorted(sql.names() - used)}"
