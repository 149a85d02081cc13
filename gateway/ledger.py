"""The effect ledger: admission (fence check + key reservation, one round
trip), the end of each attempt, and the operators' view. The statements live in
``leases/sql/effects.sql``, run through the gateway's ``Database`` (leases/db.py): a
database that gives no answer raises ``leases.Unavailable``, which the
problem middleware answers 503, once.

Every attempt carries a nonce of its own (``new_attempt``): its end is
recorded against that nonce, once, however often the statement is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import secrets
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import asyncpg

from gateway.outcomes import GivenUp, OutcomeWriter
from gateway.wire import AttemptEnd, EffectState, ExtendVerdict, Finished, Verdict
from leases import Database, Unavailable, formats
from leases.batch import Batcher

#: a resend inside a provider's idempotency window must end this long before
#: the window does (our database's clock against the provider's)
RESEND_MARGIN_SECONDS = 5.0
#: an unknown effect can be resolved only this long after its last deadline
RESOLVE_GRACE_SECONDS = 1.0
#: and "not sent" only this much later where the attempt's whole request may
#: have reached the provider's host: no reset recalls what its kernel accepted,
#: and the provider may read it and act until it gives up on the connection.
#: Ten minutes: the longest a server waits on its client (RFC 5321 4.5.3.2
#: gives SMTP servers 5 minutes, HTTP servers and their load balancers less),
#: twice over (docs/gateway.md, "What the wire still holds")
HELD_REQUEST_SECONDS = 600.0
#: nonces of abandoned attempts are kept this long
ABANDONED_KEPT_SECONDS = 86400.0
#: admission statements out at once per process; more calls gather meanwhile
ADMISSION_BATCHES_IN_FLIGHT = 4

@dataclass(frozen=True)
class Unresolved:
    """Why an effect could not be resolved: a problem code, a sentence, and
    how long to wait before trying again (None: waiting will not help)."""

    code: Literal["not_found", "effect_in_progress", "effect_not_unknown"]
    detail: str
    retry_after: float | None


def new_attempt() -> int:
    """A nonce for one attempt: random, positive, 63 bits."""
    return secrets.randbits(62) + 1


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    current_fence: int | None
    retry_after: float | None
    stored_status: int | None
    stored_headers: dict[str, str] | None
    stored_body: bytes | None


@dataclass(frozen=True)
class StoredAnswer:
    status: int
    headers: dict[str, str]
    body: bytes


#: refusals that say nothing of the request, only of the moment (a deadlock,
#: a serialisation failure, a cancelled statement or one past the pool's
#: statement_timeout, a lock not granted): the statement committed nothing
_REFUSED_IN_PASSING = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError,
                       asyncpg.QueryCanceledError, asyncpg.LockNotAvailableError)

#: one admission, as the batch statement takes it (the request's summary last)
_AdmitArgs = tuple[str, str, bytes, str, int, str, int, float, float, str | None]


def _admission(row: asyncpg.Record) -> Admission:
    headers = row["response_headers"]
    return Admission(row["verdict"], row["current_fence"], row["retry_after"],
                     row["response_status"],
                     json.loads(headers) if headers is not None else None,
                     row["response_body"])


class Ledger:
    """The effect ledger of one gateway process.

    Admissions made in the same turn of the event loop go to the database as
    one statement and one commit (``leases.batch``); the ends of attempts are
    written behind the answers, in batches too (``OutcomeWriter``), so an
    effect costs one synchronous statement on its response path, shared
    under load."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.timeout = db.timeout or 5.0
        self._background: set[asyncio.Task[None]] = set()
        self._admissions: Batcher[_AdmitArgs, Admission] = Batcher(
            self._admit_batch, max_in_flight=ADMISSION_BATCHES_IN_FLIGHT, name="admit")
        self.outcomes = OutcomeWriter(db)

    async def admit(self, client: str, key: str, fingerprint: bytes, resource: str,
                    fence: int, provider: str, attempt: int, deadline_seconds: float,
                    retry_window_seconds: float, *,
                    request_summary: str | None = None) -> Admission:
        """Check the fence and reserve the key for attempt ``attempt``; it may
        reach the provider for ``deadline_seconds`` from the database's now.
        ``request_summary`` (JSON text, effects/summary.py) is stored with the
        effect when this admission inserts it, never on a later attempt.

        If this raises (``Unavailable``, or the caller was cancelled), the
        statement may still have committed: the attempt is freed by its nonce
        in the background."""
        args: _AdmitArgs = (client, key, fingerprint, resource, fence, provider, attempt,
                            deadline_seconds, retry_window_seconds, request_summary)
        try:
            admission: Admission | None
            try:
                admission = await self._admissions(args)
            except asyncpg.PostgresError:
                # refused, so it committed nothing: a deadlock (batches take
                # their keys in order, so only with a statement of another
                # kind), a cancel, a statement timeout. Alone, it holds no key
                # while it waits, and its own refusal is its own answer.
                admission = None
            if admission is None or admission.verdict == "busy":  # alone, waiting
                row = await self.db.fetchrow("admit_effect", *args[:-1],
                                             RESEND_MARGIN_SECONDS, args[-1])
                assert row is not None
                admission = _admission(row)
        except (Unavailable, asyncio.CancelledError):
            self.free_unsent(client, key, attempt, resource)
            raise
        except _REFUSED_IN_PASSING as exc:  # it committed nothing: there is nothing to free
            raise Unavailable(f"the database refused the admission ({type(exc).__name__}); "
                              "nothing was sent") from exc
        return admission

    async def _admit_batch(self, items: Sequence[_AdmitArgs]) -> list[Admission]:
        if len(items) == 1:  # p50 92-137 µs (15-20 %) under a batch of one: bench/RESULTS.md
            row = await self.db.fetchrow("admit_effect", *items[0][:-1],
                                         RESEND_MARGIN_SECONDS, items[0][-1])
            assert row is not None
            return [_admission(row)]
        columns = [list(c) for c in zip(*items, strict=True)]
        rows = await self.db.fetch("admit_effects", *columns[:-1], RESEND_MARGIN_SECONDS,
                                   columns[-1])
        by_ord = {r["ord"]: _admission(r) for r in rows}
        return [by_ord[n + 1] for n in range(len(items))]

    async def extend(self, client: str, key: str, attempt: int, resource: str, fence: int,
                     deadline_seconds: float) -> ExtendVerdict:
        """Before a resend: move attempt ``attempt``'s deadline, and its lease's
        drain barrier, to ``deadline_seconds`` from the database's now, if the
        fence is still current and its lease live, the attempt still in
        flight, and the provider's window still covers the whole new attempt
        (``RESEND_MARGIN_SECONDS`` included). Anything else answers why not,
        and changes nothing. If this raises, it may have committed: the
        deadline is then later, nothing was sent, no harm done."""
        verdict: ExtendVerdict = await self.db.fetchval(
            "extend_effect", client, key, attempt, resource, fence, deadline_seconds,
            RESEND_MARGIN_SECONDS)
        return verdict

    def _args(self, client: str, key: str, attempt: int, resource: str, state: AttemptEnd,
              answer: StoredAnswer | None, summary: str | None,
              never_whole: bool = False) -> tuple[Any, ...]:
        return (client, key, attempt, resource, state,
                answer.status if answer else None,
                json.dumps(answer.headers) if answer else None,  # text already (http.py)
                answer.body if answer else None, summary, never_whole)

    def finish(self, client: str, key: str, attempt: int, resource: str,
               state: AttemptEnd, answer: StoredAnswer | None, summary: str | None,
               never_whole: bool = False) -> None:
        """Record the end of an attempt, behind the answer: the caller already
        has the provider's answer and does not wait for the record (a repeat
        of the key meanwhile reads in progress; a gateway that dies first
        leaves it in flight, then unknown, never sent again). Retrying is
        safe: the end of one attempt counts once. ``never_whole``: the
        attempt's request certainly never left this host whole (an unknown
        outcome that "not sent" may then settle without waiting for the
        provider to give up on a request it may hold)."""
        self.outcomes.add(self._args(client, key, attempt, resource, state, answer, summary,
                                     never_whole))

    async def free(self, client: str, key: str, attempt: int,
                   resource: str) -> Finished | None:
        """End an attempt that certainly did not act, and wait for the record,
        so a retry right after the answer finds the key free. What it came
        to (``Finished``): ``free``; ``unknown`` when an earlier attempt of
        the key may have acted (the key is not free); ``gone``; or None when
        it did not land in time (refused, or no answer; tried again in the
        background): the key may read in flight, then unknown."""
        recorded = self.outcomes.add(self._args(client, key, attempt, resource, "free", None,
                                                None))
        try:
            done = await asyncio.wait_for(asyncio.shield(recorded), self.timeout)
        except Exception:
            return None
        return cast(Finished, done)

    def free_unsent(self, client: str, key: str, attempt: int, resource: str) -> None:
        """An admission whose answer never came back may have committed: the
        key would then read in flight, then unknown, and hold the drain barrier,
        though nothing was sent. Free it, in the background, until the
        admission can no longer be running (the pool's statement_timeout)."""
        args = self._args(client, key, attempt, resource, "free", None, None)
        self._in_background(self._free_unsent(args))

    async def _free_unsent(self, args: tuple[Any, ...]) -> None:
        # at once, then again once the admission has certainly ended
        # server-side, unless a free landed before; each one the writer's to
        # try again, or give up, as any record
        for delay in (0.0, self.timeout, self.timeout * 2 + 0.5):
            await asyncio.sleep(delay)
            try:
                done = await self.outcomes.add(args, waited=False)
            except GivenUp:  # logged and counted: not tried again
                return
            if done in ("free", "unknown"):
                return

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for background writes (at shutdown)."""
        if self._background:
            await asyncio.wait(self._background, timeout=self.timeout)
        await self.outcomes.drain(self.timeout)

    async def settled(self, client: str, key: str) -> None:
        """Wait for this process to land the record of an answer it gave for
        ``key``, so a read or a repeat right after the answer sees it: up to
        the database timeout (a second was not enough on a loaded machine;
        past the timeout the database is in trouble and "in progress" is the
        honest answer)."""
        recording = self.outcomes.pending(client, key)
        if recording is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(recording), self.timeout)

    async def clients_of(self, key: str) -> list[str]:
        """The clients that have an effect under ``key`` (at most ten)."""
        return [r["client"] for r in await self.db.fetch("effect_clients", key)]

    async def show(self, client: str, key: str) -> dict[str, Any] | None:
        row = await self.db.fetchrow("show_effect", client, key, RESOLVE_GRACE_SECONDS,
                                     HELD_REQUEST_SECONDS)
        return None if row is None else effect_view(row)

    async def list(self, client: str | None, state: EffectState | None,
                   limit: int) -> list[dict[str, Any]]:
        rows = await self.db.fetch("list_effects", client, state, limit, RESOLVE_GRACE_SECONDS)
        return [effect_view(r) for r in rows]

    async def resolve(self, client: str, key: str, outcome: str,
                      operator: str | None = None) -> bool:
        """Settle an unknown effect; False if it is not unknown, or its last
        attempt's deadline (plus a grace) has not passed yet. The resolution
        is recorded (fencegate_resolutions) with ``operator``, the resolving
        client's name."""
        if outcome == "sent":
            return await self.db.fetchrow("resolve_effect_sent", client, key,
                                          RESOLVE_GRACE_SECONDS, operator) is not None
        return await self.db.fetchrow("resolve_effect_not_sent", client, key,
                                      RESOLVE_GRACE_SECONDS, operator,
                                      HELD_REQUEST_SECONDS) is not None

    async def why_unresolved(self, client: str, key: str, outcome: str) -> Unresolved:
        """Why ``resolve`` refused: the one explanation the API, the CLI and
        the console give."""
        effect = await self.show(client, key)
        if effect is None:
            return Unresolved("not_found", f"no effect with the key {key!r} for client "
                              f"{client!r}", None)
        if effect["state"] in ("in_flight", "unknown"):
            wait = effect["not_sent_in_seconds" if outcome == "not_sent"
                          else "resolvable_in_seconds"]
            if wait and effect["resolvable_in_seconds"]:
                return Unresolved("effect_in_progress", "an attempt of this effect may still "
                                  f"be under way; it can be resolved in {wait:.1f} seconds",
                                  wait)
            if wait:
                return Unresolved("effect_in_progress", "its attempt's whole request may "
                                  "have reached the provider, which may still read it and "
                                  f"act: it can be resolved not_sent in {wait:.0f} seconds "
                                  "(sent at any time)", wait)
        return Unresolved("effect_not_unknown", "only an effect whose outcome is unknown "
                          f"can be resolved (it is {effect['state']})", None)

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
    if isinstance(out.get("request_summary"), str):  # jsonb arrives as its text
        out["request_summary"] = json.loads(out["request_summary"])
    return out
