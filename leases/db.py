"""The database layer every part shares: pools, the named statements of
leases/sql, and the mapping of the driver's failures (no answer is
``Unavailable``, no free connection is ``Busy``). ``LeaseClient``, the
gateway's ledger, the queue and the console all run statements through it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from . import database, sql
from .errors import Busy
from .metrics import POOL_BUSY, POOL_WAIT

DEFAULT_POOL_SIZE = 10
DEFAULT_COMMAND_TIMEOUT = 30.0
#: how long a call waits for a free connection of the pool, by default
DEFAULT_ACQUIRE_TIMEOUT = 10.0
#: connections kept for renewals and releases (see Database._keeping)
KEEPING_POOL_SIZE = 2


class Database:
    """A pool of connections to fencegate's database, and its named statements.

    ``Database(dsn)`` opens its own pool on first use (or ``await
    db.connect()``); ``Database(pool=pool)`` borrows one; ``Database()`` uses
    the database the ``fencegate`` CLI uses (``FENCEGATE_DATABASE_URL``, or the
    embedded PostgreSQL of the nearest ``.fencegate/``). With ``timeout``, a
    call that gets no answer in that many seconds raises ``Unavailable``, as
    any call does that gets no answer at all.

    Every call may raise ``Unavailable`` (no answer from the database: what
    was asked may have happened), ``Busy`` (no pooled connection was free in
    time: nothing was sent), ``NoDatabase`` (no DSN and no database to use)
    and, on the first call, ``SchemaError`` (the database is not migrated for
    this version).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        timeout: float | None = None,
        acquire_timeout: float | None = None,
    ) -> None:
        if dsn is not None and pool is not None:
            raise ValueError("give dsn or pool, not both")
        self.timeout = timeout
        #: how long a call waits for a free connection before ``Busy``
        self.acquire_timeout = acquire_timeout if acquire_timeout is not None else \
            (timeout if timeout is not None else DEFAULT_ACQUIRE_TIMEOUT)
        self._dsn = dsn
        self._pool = pool
        self._own_pool = pool is None
        self._pool_size = pool_size
        #: renewals and releases of leases held in ``async with`` go through a
        #: connection of their own, so that a pool saturated by the work the
        #: leases guard never costs a lease (only with a pool of our own)
        self._keeping: asyncpg.Pool | None = None
        self._connect_lock = asyncio.Lock()

    async def connect(self) -> asyncpg.Pool:
        """Open the pool now (the first call does it otherwise); the pool.

        Raises:
            NoDatabase: no DSN was given and there is no database to use.
            Unavailable: the database cannot be reached.
        """
        if self._pool is None:
            async with self._connect_lock:
                if self._pool is None:
                    # no DSN: the one the CLI uses (FENCEGATE_DATABASE_URL, or the embedded server)
                    if self._dsn is None:
                        self._dsn = await asyncio.to_thread(database.database_url)
                    dsn = self._dsn
                    self._pool = await database.create_pool(
                        dsn,
                        min_size=1,
                        max_size=self._pool_size,
                        command_timeout=DEFAULT_COMMAND_TIMEOUT,
                    )
        return self._pool

    async def _keeping_pool(self) -> asyncpg.Pool:
        """The pool of renewals and releases: a small one of its own when this
        client owns its pool, else the shared one."""
        if not self._own_pool:
            return await self.connect()
        if self._keeping is None:
            await self.connect()  # resolves the DSN if none was given
            async with self._connect_lock:
                if self._keeping is None:
                    assert self._dsn is not None
                    self._keeping = await database.create_pool(
                        self._dsn, min_size=1, max_size=KEEPING_POOL_SIZE,
                        command_timeout=DEFAULT_COMMAND_TIMEOUT)
        return self._keeping

    async def close(self) -> None:
        """Close the pools this object opened (not a borrowed one)."""
        for attr in ("_pool", "_keeping"):
            pool = getattr(self, attr)
            if self._own_pool and pool is not None:
                setattr(self, attr, None)
                await pool.close()


    @contextlib.asynccontextmanager
    async def _connection(self, keeping: bool = False,
                          given: asyncpg.Connection | None = None,
                          ) -> AsyncIterator[asyncpg.Connection]:
        """A connection of the pool, or ``Busy`` when none came free in time
        (nothing was sent), or ``Unavailable`` when none could be made; or
        the caller's own (``given``: a statement in its transaction)."""
        if given is not None:
            async with database.answered(self.timeout):
                yield given
            return
        async with database.answered(self.timeout):
            pool = await (self._keeping_pool() if keeping else self.connect())
            # waiting for one of a full pool's connections is bounded by the
            # pool wait; making a new connection, by the call's own timeout
            saturated = pool.get_size() >= pool.get_max_size() and pool.get_idle_size() == 0
            started = time.monotonic()
            try:
                conn = await pool.acquire(timeout=self.acquire_timeout if saturated else None)
            except TimeoutError:
                if not saturated:
                    raise  # connecting took too long: no answer from the database
                POOL_BUSY.inc()
                raise Busy(f"no database connection came free within "
                           f"{self.acquire_timeout:g} s: this process is overloaded") from None
            POOL_WAIT.observe(time.monotonic() - started)
            try:
                yield conn
            finally:
                await pool.release(conn)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection in a transaction, for statements that must
        commit together (``connection=`` of the calls that take one); it
        commits when the block ends, and rolls back if it raises."""
        async with self._connection() as conn, conn.transaction():
            yield conn

    async def fetch(self, name: str, *args: Any,
                    connection: asyncpg.Connection | None = None) -> list[asyncpg.Record]:
        """Run the statement ``name`` of leases/sql (on ``connection``, the
        caller's, when given); its rows."""
        async with self._connection(given=connection) as conn:
            rows: list[asyncpg.Record] = await conn.fetch(sql.query(name), *args)
            return rows

    async def fetchrow(self, name: str, *args: Any, keeping: bool = False,
                       connection: asyncpg.Connection | None = None,
                       ) -> asyncpg.Record | None:
        """Run the statement ``name`` of leases/sql; its first row, or None."""
        async with self._connection(keeping, connection) as conn:
            row: asyncpg.Record | None = await conn.fetchrow(sql.query(name), *args)
            return row

    async def fetchval(self, name: str, *args: Any,
                       connection: asyncpg.Connection | None = None) -> Any:
        """Run the statement ``name`` of leases/sql; its first value."""
        async with self._connection(given=connection) as conn:
            return await conn.fetchval(sql.query(name), *args)

    async def fetch_keeping(self, name: str, *args: Any) -> list[asyncpg.Record]:
        """``fetch`` on the connections kept for renewals and releases."""
        async with self._connection(keeping=True) as conn:
            rows: list[asyncpg.Record] = await conn.fetch(sql.query(name), *args)
            return rows

    async def execute(self, name: str, *args: Any) -> int:
        """Run a statement; how many rows it touched."""
        async with self._connection() as conn:
            status: str = await conn.execute(sql.query(name), *args)
            return int(status.split()[-1])
