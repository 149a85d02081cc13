"""The storage-side fence, for a database that is not the fencegate one.

``fencegate_check_fence`` guards writes to the fencegate database. Rows
elsewhere (another PostgreSQL, a receiver's own tables) carry the fence
themselves: a ``fence bigint`` column beside the data, and every write
repeats the precondition in its own statement::

    UPDATE t SET c1 = $2, fence = $3 WHERE id = $1 AND fence <= $3
    INSERT INTO t AS existing (id, c1, fence) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO UPDATE SET c1 = excluded.c1, fence = excluded.fence
        WHERE existing.fence <= excluded.fence RETURNING fence

Zero rows means a newer fence has written the row: the write is refused and
the caller has lost its lease. ``<=``, not ``<``: the holder writes the row as
often as it likes under its own fence. Concurrent writers of one row queue
on its lock, and each re-reads ``fence`` once it gets the row (PostgreSQL's
READ COMMITTED re-check of the WHERE clause), so no older fence's write
lands after a newer one's, whatever the order they commit in.

This builds those statements with every name quoted, for asyncpg's ``$n``
parameters, and runs them (``fenced_write``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["Executor", "fenced_update", "fenced_upsert", "fenced_write", "quote_name"]

#: the alias of the row already there, in an upsert's condition
_EXISTING = "existing"


class Executor(Protocol):
    """What runs a statement: an asyncpg ``Connection`` (in the caller's
    transaction) or ``Pool``."""

    async def fetchval(self, query: str, *args: Any) -> Any: ...


def quote_name(name: str | Sequence[str]) -> str:
    """A SQL identifier, double-quoted (``"a""b"`` for ``a"b``); a sequence
    is a qualified name (``("app", "orders")`` is ``"app"."orders"``)."""
    parts = [name] if isinstance(name, str) else list(name)
    if not parts or any(not part or "\x00" in part for part in parts):
        raise ValueError(f"not a SQL name: {name!r}")
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


def _checked(key: str, columns: Sequence[str], fence_column: str) -> None:
    names = [key, *columns, fence_column]
    if len(set(names)) != len(names):
        raise ValueError(f"the key, the columns and the fence column must differ: {names}")


def fenced_update(table: str | Sequence[str], key: str, columns: Sequence[str], *,
                  fence_column: str = "fence") -> str:
    """``UPDATE`` of ``columns`` of the row whose ``key`` is ``$1``, only while
    its fence is at most the writer's. Parameters: ``$1`` the key, then one per
    column, then the fence. ``RETURNING`` the fence: None means refused (or
    no such row)."""
    _checked(key, columns, fence_column)
    fence = f"${len(columns) + 2}"
    sets = [f"{quote_name(c)} = ${i}" for i, c in enumerate(columns, start=2)]
    f = quote_name(fence_column)
    return (f"UPDATE {quote_name(table)} SET {', '.join([*sets, f'{f} = {fence}'])} "
            f"WHERE {quote_name(key)} = $1 AND {f} <= {fence} RETURNING {f}")


def fenced_upsert(table: str | Sequence[str], key: str, columns: Sequence[str], *,
                  fence_column: str = "fence") -> str:
    """``INSERT ... ON CONFLICT (key) DO UPDATE`` that writes only while the
    row's fence is at most the writer's; ``key`` needs a unique constraint.
    Parameters as ``fenced_update``. ``RETURNING`` the fence: None means
    refused."""
    _checked(key, columns, fence_column)
    names = [quote_name(n) for n in (key, *columns, fence_column)]
    values = [f"${i}" for i in range(1, len(names) + 1)]
    f = quote_name(fence_column)
    sets = [f"{n} = excluded.{n}" for n in names[1:]]
    return (f"INSERT INTO {quote_name(table)} AS {_EXISTING} ({', '.join(names)}) "
            f"VALUES ({', '.join(values)}) ON CONFLICT ({names[0]}) DO UPDATE "
            f"SET {', '.join(sets)} WHERE {_EXISTING}.{f} <= excluded.{f} RETURNING {f}")


async def fenced_write(db: Executor, table: str | Sequence[str], key: str, key_value: Any,
                       values: Mapping[str, Any], fence: int, *, fence_column: str = "fence",
                       insert: bool = True) -> bool:
    """Write ``values`` to the row ``key = key_value`` under ``fence``:
    True if written, False if a newer fence had written it (or, with
    ``insert=False``, there is no such row). Run on a connection inside a
    transaction, the row stays locked until it ends: a newer fence's write
    waits for the commit, then lands after it."""
    columns = list(values)
    build = fenced_upsert if insert else fenced_update
    written = await db.fetchval(build(table, key, columns, fence_column=fence_column),
                                key_value, *values.values(), fence)
    return written is not None
