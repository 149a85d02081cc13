"""The effect ledger: admission (fence check + key reservation, one round
trip), the end of each attempt, and the operators' view. The statements live in
``leases/sql/effects.sql``, run through the gateway's ``LeaseClient``: a
database that gives no answer raises ``leases.Unavailable``, which the
problem middleware answers 503, once.

Every attempt carries a nonce of its own (``new_attempt``): its end is
recorded against that nonce, once, however often the statement is retried.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from leases import LeaseClient, Unavailable, formats

from .wire import Verdict

log = logging.getLogger("fencegate.gateway")

#: a resend inside a provider's idempotency window must end this long before
#: the window does (our database's clock against the provider's)
RESEND_MARGIN_SECONDS = 5.0
#: an unknown effect can be resolved only this long after its last deadline
RESOLVE_GRACE_SECONDS = 1.0
#: how long an outcome that could not be recorded is retried in the background
RECORD_RETRY_SECONDS = 60.0
#: nonces of abandoned attempts are kept this long
ABANDONED_KEPT_SECONDS = 86400.0

FinalState = Literal["succeeded", "failed", "unknown", "free"]
#: what recording the end of an attempt did (see fencegate_finish_effect)
Finished = Literal["recorded", "freed", "unknown", "gone"]


def new_attempt() -> int:
    """A nonce for one attempt: random, positive, 63 bits."""
    return secrets.randbits(62) + 1


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
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
    def __init__(self, db: LeaseClient) -> None:
        self.db = db
        self.timeout = db.timeout or 5.0
        self._background: set[asyncio.Task[None]] = set()

    async def admit(self, client: str, key: str, fingerprint: bytes, resource: str,
                    fence: int, provider: str, attempt: int, deadline_seconds: float,
                    retry_window_seconds: float) -> Admission:
        """Check the fence and reserve the key for attempt ``attempt``; it may
        reach the provider for ``deadline_seconds`` from the database's now.

        If this raises ``Unavailable``, the statement may still have
        committed: call ``free_unsent`` with the same nonce."""
        row = await self.db.fetchrow(
            "admit_effect", client, key, fingerprint, resource, fence, provider, attempt,
            deadline_seconds, retry_window_seconds, RESEND_MARGIN_SECONDS)
        assert row is not None
        headers = row["response_headers"]
        return Admission(row["verdict"], row["current_fence"], row["effect_id"],
                         row["retry_after"], row["response_status"],
                         json.loads(headers) if headers is not None else None,
                         row["response_body"])

    def _args(self, client: str, key: str, attempt: int, resource: str, state: FinalState,
              answer: StoredAnswer | None, summary: str | None) -> tuple[Any, ...]:
        return (client, key, attempt, resource, state,
                answer.status if answer else None,
                json.dumps(answer.headers) if answer else None,
                answer.body if answer else None, summary)

    async def finish(self, client: str, key: str, attempt: int, resource: str,
                     state: FinalState, answer: StoredAnswer | None,
                     summary: str | None) -> None:
        """Record the end of an attempt. If the database is gone, keep trying in
        the background: the caller already has the provider's answer. Retrying
        is safe: the end of one attempt counts once."""
        args = self._args(client, key, attempt, resource, state, answer, summary)
        if await self._try(args) is None:
            self._in_background(self._finish_later(args))

    def free_unsent(self, client: str, key: str, attempt: int, resource: str) -> None:
        """An admission whose answer never came back may have committed: the
        key would then read in flight, then unknown, and hold the drain barrier,
        though nothing was sent. Free it, in the background, until the
        admission can no longer be running (the pool's statement_timeout)."""
        args = self._args(client, key, attempt, resource, "free", None, None)
        self._in_background(self._free_unsent(args))

    async def _free_unsent(self, args: tuple[Any, ...]) -> None:
        # at once, then once the admission has certainly ended server-side
        for delay in (0.0, self.timeout, self.timeout * 2 + 0.5):
            await asyncio.sleep(delay)
            done = await self._try(args)
            if done in ("freed", "unknown"):
                return
        if done is None:
            await self._finish_later(args)

    async def _try(self, args: tuple[Any, ...]) -> Finished | None:
        """Record an attempt's end; None when the database gave no answer."""
        try:
            done: Finished = await self.db.fetchval("finish_effect", *args)
        except Unavailable:
            return None
        return done

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _finish_later(self, args: tuple[Any, ...]) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + RECORD_RETRY_SECONDS
        while loop.time() < give_up:
            await asyncio.sleep(1)
            if await self._try(args) is not None:
                return
        log.error("could not record an effect's outcome; it will read as unknown",
                  extra={"client": args[0], "key": args[1], "state": args[4]})

    async def drain(self) -> None:
        """Wait for background writes (at shutdown)."""
        if self._background:
            await asyncio.wait(self._background, timeout=self.timeout)

    async def show(self, client: str, key: str) -> dict[str, Any] | None:
        row = await self.db.fetchrow("show_effect", client, key, RESOLVE_GRACE_SECONDS)
        return None if row is None else effect_view(row)

    async def list(self, client: str | None, state: str | None,
                   limit: int) -> list[dict[str, Any]]:
        rows = await self.db.fetch("list_effects", client, state, limit, RESOLVE_GRACE_SECONDS)
        return [effect_view(r) for r in rows]

    async def resolve(self, client: str, key: str, outcome: str) -> bool:
        """Settle an unknown effect; False if it is not unknown, or its last
        attempt's deadline (plus a grace) has not passed yet."""
        name = "resolve_effect_sent" if outcome == "sent" else "resolve_effect_not_sent"
        return await self.db.fetchrow(name, client, key, RESOLVE_GRACE_SECONDS) is not None

    async def purge(self, retention_seconds: float, batch: int = 1000) -> int:
        """Delete finished effects past retention, in batches until caught up;
        how many."""
        total = 0
        while True:
            done = await self.db.execute("purge_effects", retention_seconds, batch)
            total += done
            if done < batch:
                return total
            await asyncio.sleep(0)  # let the effect path in between batches

    async def purge_abandoned(self) -> None:
        """Forget nonces of abandoned attempts after a day."""
        await self.db.execute("purge_abandoned_attempts", ABANDONED_KEPT_SECONDS)

    async def awaiting_purge(self, retention_seconds: float) -> int:
        """Finished effects past retention, not yet purged."""
        n: int = await self.db.fetchval("effects_awaiting_purge", retention_seconds)
        return n


def effect_view(row: asyncpg.Record) -> dict[str, Any]:
    """An effect as operators see it (JSON-ready)."""
    out: dict[str, Any] = {}
    for k, v in dict(row).items():
        out[k] = formats.timestamp(v) if isinstance(v, dt.datetime) else v
    out["provider_response"] = {"status": out.pop("response_status"),
                                "summary": out.pop("summary")}
    return out
