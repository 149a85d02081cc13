"""``?statement_cache_size=0`` in the DSN: what PgBouncer in transaction mode
needs of asyncpg (docs/operations.md, "PgBouncer"). asyncpg would otherwise
send the parameter to the server as a setting, and the server refuses it."""

from __future__ import annotations

import asyncio

import asyncpg

from leases import LeaseClient, database, migrate


def _with(dsn: str, param: str) -> str:
    return dsn + ("&" if "?" in dsn else "?") + param


def test_the_option_is_taken_out_of_the_dsn_and_the_rest_kept() -> None:
    dsn = "postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write" \
          "&statement_cache_size=0&host=/run/x"
    rest, options = database.connect_options(dsn)
    assert options == {"statement_cache_size": 0}
    assert rest == "postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write" \
                   "&host=/run/x"
    assert database.connect_options("postgresql://h/db") == ("postgresql://h/db", {})


async def test_no_named_prepared_statement_is_left_on_the_server(dsn: str) -> None:
    """Every statement of a claim, a renewal, a release and a migration check
    is sent unnamed: nothing a pooler could hand to the wrong client."""
    pooled = _with(dsn, "statement_cache_size=0")
    assert await migrate.migrate_dsn(pooled) == []  # already migrated: a no-op
    async with LeaseClient(pooled, owner="w", pool_size=1) as client:
        for i in range(3):
            lease = await client.claim(f"run:pooled-{i}", ttl=30)
            assert lease is not None
            await lease.renew()
            assert await lease.release()
        pool = await client.connect()
        async with pool.acquire() as conn:
            named = await conn.fetchval("SELECT count(*) FROM pg_prepared_statements")
    assert named == 0


async def test_without_the_option_asyncpg_names_its_statements(dsn: str) -> None:
    """The control: the default cache prepares named statements (so the test
    above shows something)."""
    async with LeaseClient(dsn, owner="w", pool_size=1) as client:
        assert await client.claim("run:cached", ttl=30) is not None
        pool = await client.connect()
        async with pool.acquire() as conn:
            named = await conn.fetchval("SELECT count(*) FROM pg_prepared_statements")
    assert named > 0
    assert isinstance(pool, asyncpg.Pool)


async def test_an_up_to_date_database_is_not_locked_to_be_checked(dsn: str) -> None:
    """Behind a transaction-mode pooler, a migrator's session advisory lock can
    stay behind on a server connection (lock, work and unlock each landed on
    another one). A gateway starting on an up-to-date schema must not wait
    for it: it took the lock first, and waited forever."""
    leaked = await asyncpg.connect(dsn)
    try:
        await leaked.execute("SELECT pg_advisory_lock($1)", migrate._LOCK_KEY)
        assert await asyncio.wait_for(migrate.migrate_dsn(dsn), 5) == []
    finally:
        await leaked.close()
