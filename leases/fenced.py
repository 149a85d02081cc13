"""Fenced writes in the caller's own transaction: the fence check of
``fencegate_check_fence`` on a connection the caller holds, and its refusal
(SQLSTATE FG412) as ``FenceRefused``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import cast

import asyncpg

from . import sql
from .errors import FENCE_REFUSED_SQLSTATE, FenceRefusal, FenceRefused


def refusal(error: BaseException, resource: str, fence: int) -> FenceRefused | None:
    """The ``FenceRefused`` that ``error`` is (an FG412 from the database), or None."""
    if isinstance(error, asyncpg.PostgresError) and error.sqlstate == FENCE_REFUSED_SQLSTATE:
        code = cast(FenceRefusal, str(error.args[0]) if error.args else "stale_fence")
        return FenceRefused(resource, fence, code, getattr(error, "detail", None) or "")
    return None


@contextlib.asynccontextmanager
async def refusals(resource: str, fence: int) -> AsyncIterator[None]:
    """FG412 raised inside comes out as ``FenceRefused``."""
    try:
        yield
    except asyncpg.PostgresError as e:
        refused = refusal(e, resource, fence)
        if refused is None:
            raise
        raise refused from e


async def check_fence(conn: asyncpg.Connection, resource: str, fence: int) -> None:
    """``fencegate_check_fence`` on ``conn``, inside the caller's transaction:
    raises ``FenceRefused`` unless ``fence`` is current and its lease live;
    passed, no newer fence of ``resource`` is granted until the transaction
    ends."""
    if not conn.is_in_transaction():
        raise RuntimeError("a fence check holds only inside a transaction: "
                           "use `async with conn.transaction():` or lease.transaction(conn)")
    async with refusals(resource, fence):
        await conn.execute(sql.query("check_fence"), resource, fence)

