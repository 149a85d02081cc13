"""Where a receiver keeps the highest fence it has seen per resource: a
``FenceStore``. ``advance`` is the whole check, atomic: a fence lower than
the highest is refused, an equal one passes (the same holder sending
again), a higher one becomes the highest.

``PostgresFences`` keeps them in a table of the receiver's own PostgreSQL
with the storage-side fence (leases/column_fence.py): one upsert whose
update holds only while the stored fence is at most the new one. Run on a
connection inside the receiver's own transaction, the resource's row stays
locked until that transaction ends, so a newer fence's request waits for
the older one's writes to commit and is checked after them.
``MemoryFences`` is for tests and a single process.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

from leases.column_fence import fenced_upsert, quote_name

__all__ = ["DEFAULT_TABLE", "FenceStore", "MemoryFences", "PostgresFences"]

DEFAULT_TABLE = "fencegate_receiver_fences"


class FenceStore(Protocol):
    """The highest fence seen per resource."""

    async def advance(self, resource: str, fence: int) -> int:
        """Record ``fence`` unless a higher one is recorded; the highest after.
        ``fence`` passed if the answer equals it."""
        ...


class MemoryFences:
    """Fences in this process's memory (tests, a single process)."""

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}
        self._lock = threading.Lock()  # atomic across threads too (sync handlers)

    async def advance(self, resource: str, fence: int) -> int:
        with self._lock:
            highest = self._highest.get(resource, fence)
            if fence >= highest:
                self._highest[resource] = highest = fence
            return highest

    def highest(self, resource: str) -> int | None:
        """The highest fence seen for ``resource`` (None: none yet)."""
        with self._lock:
            return self._highest.get(resource)


class _Executor(Protocol):
    async def execute(self, query: str, *args: Any) -> Any: ...
    async def fetchval(self, query: str, *args: Any) -> Any: ...


class PostgresFences:
    """Fences in the receiver's PostgreSQL (asyncpg). ``db`` is a pool, or a
    connection in the receiver's transaction (``PostgresFences(conn)``: the
    check commits, or rolls back, with the receiver's own writes)."""

    def __init__(self, db: _Executor, table: str | Sequence[str] = DEFAULT_TABLE) -> None:
        self.db = db
        self.table = table
        self._advance = fenced_upsert(table, "resource", [])
        self._highest = f"SELECT fence FROM {quote_name(table)} WHERE resource = $1"

    async def create_table(self) -> None:
        """Create the table unless it exists."""
        await self.db.execute(
            f"CREATE TABLE IF NOT EXISTS {quote_name(self.table)} "
            "(resource text PRIMARY KEY, fence bigint NOT NULL CHECK (fence >= 0))")

    async def advance(self, resource: str, fence: int) -> int:
        written = await self.db.fetchval(self._advance, resource, fence)
        if written is not None:
            return int(written)
        # refused: in a transaction the upsert keeps the row locked, so this
        # reads the fence that refused it; outside one, at most a higher one
        return int(await self.db.fetchval(self._highest, resource))

    async def highest(self, resource: str) -> int | None:
        """The highest fence seen for ``resource`` (None: none yet)."""
        value = await self.db.fetchval(self._highest, resource)
        return None if value is None else int(value)
