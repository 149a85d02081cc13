"""Shared fixtures: a real PostgreSQL, and a fresh migrated database per test.

The schema is applied once per session to a template database; each test gets
``CREATE DATABASE ... TEMPLATE`` of it, which takes milliseconds.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from leases import database, migrate

#: this session's template: two test runs at once (two `make test` in one
#: checkout, or beside a benchmark) share the embedded server, and must not
#: drop each other's databases
TEMPLATE = f"fencegate_template_{os.getpid()}"
_counter = itertools.count()


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """DSN of the test server's maintenance database."""
    if os.environ.get(database.DATABASE_URL_ENV):
        yield os.environ[database.DATABASE_URL_ENV]
        return
    yield database.start_embedded(database.home() / "test-pgdata", scratch=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _left_by_the_dead(names: list[str]) -> list[str]:
    """Test databases whose session's process is gone (killed runs leave them)."""
    dead = []
    for name in names:
        pid = name.removeprefix("fencegate_template_").removeprefix("fg_test_").split("_")[0]
        if not pid.isdigit() or not _alive(int(pid)) or int(pid) == os.getpid():
            dead.append(name)
    return dead


async def _create_template(dsn: str) -> None:
    admin = await asyncpg.connect(dsn)
    try:
        names = [r[0] for r in await admin.fetch(
            "SELECT datname FROM pg_database WHERE datname LIKE 'fg\\_test\\_%' "
            "OR datname LIKE 'fencegate\\_template%'")]
        for name in _left_by_the_dead(names):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await admin.close()
    await migrate.migrate_dsn(database.with_database(dsn, TEMPLATE))


async def _drop_template(dsn: str) -> None:
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def template_ready(server_dsn: str) -> Iterator[str]:
    asyncio.run(_create_template(server_dsn))
    yield server_dsn
    asyncio.run(_drop_template(server_dsn))


@pytest.fixture
async def dsn(template_ready: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test."""
    name = f"fg_test_{os.getpid()}_{next(_counter)}"
    admin = await asyncpg.connect(template_ready)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE {TEMPLATE}')
    finally:
        await admin.close()
    yield database.with_database(template_ready, name)
    admin = await asyncpg.connect(template_ready)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(dsn, min_size=1, max_size=40)
    yield p
    try:
        await p.close()
    except OSError:  # a test ended its sessions server-side (test_read_only_database)
        p.terminate()  # and the close's goodbye met a socket already cut
