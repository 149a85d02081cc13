"""The effect ledger: admission (fence check + key reservation, one round
trip), the end of each attempt, and the operators' view. The statements live in
``leases/sql/queries.sql`` with every other statement."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import asyncpg

from leases import sql
from leases.client import UNREACHABLE_ERRORS

from .metrics import DB_UNAVAILABLE
from .problems import Problem

log = logging.getLogger("fencegate.gateway")

#: an effect's deadline is its provider's timeout plus this
DEADLINE_SLACK_SECONDS = 2.0

FinalState = Literal["succeeded", "failed", "unknown", "free"]
T = TypeVar("T")


@dataclass(frozen=True)
class Admission:
    verdict: str
    current_fence: int | None
    effect_id: int | None
    retry_after: float | None
    stored_status: int | None
    stored_headers: dict[str, str] | None
    stored_body: bytes | None


@dataclass(frozen=True)
class StoredAnswer:
    status: int
    headers: dict[str, str]
    body: bytes


class Ledger:
    def __init__(self, pool: asyncpg.Pool, timeout_seconds: float) -> None:
        self.pool = pool
        self.timeout = timeout_seconds
        self._background: set[asyncio.Task[None]] = set()

    async def call(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one database call; any failure to reach the database is a 503."""
        try:
            async with asyncio.timeout(self.timeout):
                return await op()
        except UNREACHABLE_ERRORS as exc:
            DB_UNAVAILABLE.inc()
            log.warning("database unreachable", extra={"error": type(exc).__name__})
            raise Problem("unavailable", "the database cannot be reached; nothing was sent",
                          headers={"Retry-After": "1"}) from None

    async def admit(self, client: str, key: str, fingerprint: bytes, resource: str,
                    fence: int, provider: str, deadline_seconds: float,
                    retry_window_seconds: float) -> Admission:
        row = await self.call(lambda: self.pool.fetchrow(
            sql.query("admit_effect"), client, key, fingerprint, resource, fence, provider,
            deadline_seconds, retry_window_seconds,
        ))
        assert row is not None
        headers = row["response_headers"]
        return Admission(row["verdict"], row["current_fence"], row["effect_id"],
                         row["retry_after"], row["response_status"],
                         json.loads(headers) if headers is not None else None,
                         row["response_body"])

    async def finish(self, effect_id: int, resource: str, fence: int, state: FinalState,
                     answer: StoredAnswer | None, summary: str | None) -> None:
        """Record the end of an attempt. If the database is gone, keep trying in
        the background: the caller already has the provider's answer."""
        args = (effect_id, resource, fence, state,
                answer.status if answer else None,
                json.dumps(answer.headers) if answer else None,
                answer.body if answer else None, summary)
        try:
            await self.call(lambda: self.pool.fetchval(sql.query("finish_effect"), *args))
        except Problem:
            task = asyncio.get_running_loop().create_task(self._finish_later(args))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _finish_later(self, args: tuple[Any, ...], attempts: int = 60) -> None:
        for _ in range(attempts):
            await asyncio.sleep(1)
            try:
                async with asyncio.timeout(self.timeout):
                    await self.pool.fetchval(sql.query("finish_effect"), *args)
                return
            except UNREACHABLE_ERRORS:
                continue
        log.error("could not record an effect's outcome; it will read as unknown",
                  extra={"effect_id": args[0]})

    async def drain(self) -> None:
        """Wait for background writes (at shutdown)."""
        if self._background:
            await asyncio.wait(self._background, timeout=self.timeout)

    async def show(self, client: str, key: str) -> dict[str, Any] | None:
        row = await self.call(lambda: self.pool.fetchrow(sql.query("show_effect"), client, key))
        return None if row is None else effect_view(row)

    async def list(self, client: str | None, state: str | None,
                   limit: int) -> list[dict[str, Any]]:
        rows = await self.call(
            lambda: self.pool.fetch(sql.query("list_effects"), client, state, limit))
        return [effect_view(r) for r in rows]

    async def resolve(self, client: str, key: str, outcome: str) -> bool:
        name = "resolve_effect_sent" if outcome == "sent" else "resolve_effect_not_sent"
        row = await self.call(lambda: self.pool.fetchrow(sql.query(name), client, key))
        return row is not None

    async def purge(self, retention_seconds: float, batch: int = 1000) -> int:
        status = await self.call(
            lambda: self.pool.execute(sql.query("purge_effects"), retention_seconds, batch))
        return int(status.split()[-1])


def effect_view(row: asyncpg.Record) -> dict[str, Any]:
    """An effect as operators see it (JSON-ready)."""
    out: dict[str, Any] = {}
    for k, v in dict(row).items():
        out[k] = v.isoformat() if isinstance(v, dt.datetime) else v
    out["provider_response"] = {"status": out.pop("response_status"),
                                "summary": out.pop("summary")}
    return out
