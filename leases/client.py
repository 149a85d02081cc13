"""The lease client workers embed: ``LeaseClient`` claims, renews and releases;
the ``Lease`` it answers (leases/lease.py) keeps itself renewed in ``async with``."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import secrets
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from . import clock, policy
from .batch import Batcher
from .db import DEFAULT_COMMAND_TIMEOUT, DEFAULT_POOL_SIZE, Database
from .errors import Busy, Unavailable
from .lease import Lease
from .metrics import LEASE_CLAIMS, LEASE_RENEWALS

log = logging.getLogger("fencegate.leases")
#: every claim, won or lost (DEBUG: turn it on to see who got which fence)
claims_log = logging.getLogger("fencegate.leases.claims")

#: at close, how long releases of lost leases may still take
RELEASE_ON_CLOSE_SECONDS = 2.0
#: a renewal or release waits this long at most for a row another transaction
#: holds locked, then tries again on a connection taken anew: one of the few
#: kept connections is never held for as long as the lock lasts, which would
#: starve the renewals of the other leases
LOCK_WAIT_SECONDS = 0.25


class _Locked:
    """A renewal of a batch skipped, or a release not made: another
    transaction held its row (or, for a release, a row of its batch) locked."""


LOCKED = _Locked()


@dataclass(frozen=True)
class LeaseInfo:
    """What the database holds for a resource."""

    resource: str
    owner: str
    fence: int
    expires_at: dt.datetime
    live: bool


class LeaseClient(Database):
    """Claims, renews and releases leases in PostgreSQL.

    ``LeaseClient(dsn)`` opens its own pool on first use (or ``await
    client.connect()``); ``LeaseClient(pool=pool)`` borrows one; ``LeaseClient()``
    uses the database the ``fencegate`` CLI uses (``FENCEGATE_DATABASE_URL``, or
    the embedded PostgreSQL of the nearest ``.fencegate/``). With
    ``timeout``, a call that gets no answer in that many seconds raises
    ``Unavailable``, as any call does that gets no answer at all.

    Without ``owner``, every lease gets an owner of its own (this process's
    id and a random part), so two tasks of one process never both hold a
    resource. With ``owner``, leases are claimed under that exact id, and a
    live lease of the same owner can be claimed again (contract rule 1).

    Every call may raise ``Unavailable`` (no answer from the database: what
    was asked may have happened), ``Busy`` (no pooled connection was free in
    time: nothing was sent), ``InvalidArgument`` (a resource, owner, fence or
    ttl out of bounds), ``NoDatabase`` (no DSN and no database to use) and, on
    the first call, ``SchemaError`` (the database is not migrated for this
    version). Losing a claim is not an error: ``claim`` answers ``None``.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        owner: str | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        timeout: float | None = None,
        acquire_timeout: float | None = None,
    ) -> None:
        super().__init__(dsn, pool=pool, pool_size=pool_size, timeout=timeout,
                         acquire_timeout=acquire_timeout)
        self._fixed_owner = owner is not None
        self.owner = policy.check_owner(owner) if owner else policy.default_owner()
        self._background: set[asyncio.Task[None]] = set()
        # concurrent claims, renewals and releases of this process share
        # statements and commits (leases/batch.py)
        self._claims: Batcher[tuple[str, str, float], asyncpg.Record | None] = \
            Batcher(self._claim_batch, name="claim")
        self._renewals: Batcher[tuple[str, str, int, float, float],
                                dt.datetime | _Locked | None] = \
            Batcher(self._renew_batch, name="renew")
        self._releases: Batcher[tuple[str, str, int], bool | _Locked] = \
            Batcher(self._release_batch, name="release")


    async def close(self) -> None:
        """Stop renewing, finish the releases of lost leases still under way
        (briefly), and close the pool this client opened (not a borrowed one)."""
        if self._background:  # releases of lost leases still under way
            await asyncio.wait(set(self._background), timeout=RELEASE_ON_CLOSE_SECONDS)
            for task in set(self._background):
                task.cancel()
        await super().close()


    def new_owner(self) -> str:
        """The owner for a new lease: the fixed one, or a fresh one per lease."""
        if self._fixed_owner:
            return self.owner
        return f"{self.owner}:{secrets.token_hex(4)}"

    async def __aenter__(self) -> LeaseClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the named statements, with no answer mapped to Unavailable ----------

    async def _claim_batch(self, items: Sequence[tuple[str, str, float]],
                           ) -> list[asyncpg.Record | None]:
        if len(items) == 1:  # p50 35-59 µs (6-11 %) under a batch of one: bench/RESULTS.md
            return [await self.fetchrow("claim_lease", *items[0])]
        rows = await self.fetch("claim_leases", [i[0] for i in items], [i[1] for i in items],
                                [i[2] for i in items])
        won = {r["ord"]: r for r in rows}
        return [won.get(n + 1) for n in range(len(items))]

    async def _renew_batch(self, items: Sequence[tuple[str, str, int, float, float]],
                           ) -> list[dt.datetime | _Locked | None]:
        # one renewal too: a statement that waited for a locked row here would
        # hold one of the batcher's few places (and the other leases' renewals
        # behind it) while it waits; a locked row is renewed alone, outside
        rows = await self.fetch_keeping("renew_leases", *(list(c) for c in zip(*items,
                                                                              strict=True)))
        renewed: dict[int, dt.datetime | _Locked] = {
            r["ord"]: LOCKED if r["locked"] else r["expires_at"] for r in rows}
        return [renewed.get(n + 1) for n in range(len(items))]

    async def _renew_alone(self, item: tuple[str, str, int, float, float],
                           ) -> dt.datetime | None:
        """One renewal in a statement of its own, which waits for its row
        should another transaction hold it locked: ``LOCK_WAIT_SECONDS`` at a
        time, each try on a connection taken anew, so that a row locked for
        long never holds a kept connection (and the other leases' renewals
        waiting for one) for as long."""
        give_up = self._lock_wait_ends()
        while True:
            try:
                row = await self.fetchrow("renew_lease", *item, LOCK_WAIT_SECONDS,
                                          keeping=True)
            except asyncpg.LockNotAvailableError:
                if clock.now() >= give_up:
                    raise  # a refusal: nothing changed
                await asyncio.sleep(0)  # the connection went back: waiters go first
                continue
            expires_at: dt.datetime | None = None if row is None else row["expires_at"]
            return expires_at

    def _lock_wait_ends(self) -> float:
        """When a renewal or release that keeps finding its row locked gives
        up (a refusal, ``LockNotAvailableError``): after as long as one
        statement may take (the call's timeout, else the command timeout)."""
        return clock.now() + (self.timeout if self.timeout is not None
                              else DEFAULT_COMMAND_TIMEOUT)

    async def _release_batch(self, items: Sequence[tuple[str, str, int]],
                             ) -> list[bool | _Locked]:
        """The releases in one statement, which waits for a locked row
        ``LOCK_WAIT_SECONDS`` at most: then none of them was made, and each
        answers ``LOCKED`` (``release`` makes it alone, outside the batcher,
        so that row holds back only its own release)."""
        try:
            rows = await self.fetch_keeping(
                "release_leases", *(list(c) for c in zip(*items, strict=True)),
                LOCK_WAIT_SECONDS)
        except asyncpg.LockNotAvailableError:
            return [LOCKED] * len(items)
        released = {r["ord"] for r in rows}
        return [n + 1 in released for n in range(len(items))]

    async def _release_alone(self, item: tuple[str, str, int]) -> bool:
        """One release whose row was locked: waits for it as ``_renew_alone``
        does."""
        give_up = self._lock_wait_ends()
        while True:
            await asyncio.sleep(0)  # the connection went back: waiters go first
            try:
                return await self.fetchrow("release_lease", *item, LOCK_WAIT_SECONDS,
                                           keeping=True) is not None
            except asyncpg.LockNotAvailableError:
                if clock.now() >= give_up:
                    raise  # a refusal: nothing changed

    async def claim(
        self,
        resource: str,
        ttl: float,
        *,
        owner: str | None = None,
        renewal: policy.RenewalPolicy | None = None,
    ) -> Lease | None:
        """Claim ``resource`` for ``ttl`` seconds; ``None`` if someone else holds it.

        If the claim gets no answer (the database is unreachable, or the call
        is cancelled) it may still have been granted. Under an owner of its
        own, made up for this claim, nobody could ever renew or release it:
        it is abandoned in the background (see ``abandon``). A caller that
        names its owner can simply claim again as the same owner.

        Raises:
            Unavailable: no answer; the claim may have been granted (see above).
            Busy: no pooled connection was free in time; nothing was sent.
            InvalidArgument: the resource, owner or ttl is out of bounds.
        """
        made_up = not owner and not self._fixed_owner
        owner = policy.check_owner(owner) if owner else self.new_owner()
        ttl = policy.check_ttl(ttl)
        policy.check_resource(resource)
        sent_at = clock.now()
        try:
            row = await self._claims((resource, owner, ttl))
        except (Busy, asyncpg.PostgresError):
            raise  # nothing was sent, or the database refused it: nothing granted
        except BaseException:
            if made_up:
                self.abandon(resource, owner, ttl)
            raise
        if row is None:
            LEASE_CLAIMS.labels(result="held").inc()
            claims_log.debug("claim of %s lost: held by another owner", resource, extra={
                "resource": resource, "owner": owner, "result": "held"})
            return None
        LEASE_CLAIMS.labels(result="won").inc()
        claims_log.debug("claimed %s: fence %s, owner %s", resource, row["fence"], owner,
                         extra={"resource": resource, "owner": owner, "fence": row["fence"],
                                "result": "won"})
        return Lease(
            self, row["resource"], row["owner"], row["fence"], row["expires_at"],
            ttl, sent_at, renewal or policy.RenewalPolicy(ttl),
        )

    async def renew(
        self, resource: str, owner: str, fence: int, ttl: float, *, margin: float = 0.0
    ) -> dt.datetime | None:
        """Extend a live lease held by ``owner`` under ``fence``; its new expiry, or
        ``None`` when the lease is no longer theirs. With ``margin``, also
        ``None`` once the lease is within ``margin`` seconds of its expiry (by
        the database's clock): the holder has given up by then.

        Raises:
            Unavailable: no answer; the renewal may have happened.
            Busy: no pooled connection was free in time; nothing was sent.
        """
        item = (policy.check_resource(resource), policy.check_owner(owner),
                policy.check_fence(fence), policy.check_ttl(ttl), float(margin))
        answer = await self._renewals(item)
        # its row was locked by another transaction: the batch went on
        # without it (fencegate_renew_leases), and it waits on its own
        expires_at = await self._renew_alone(item) if isinstance(answer, _Locked) else answer
        LEASE_RENEWALS.labels(result="ok" if expires_at else "lost").inc()
        return expires_at

    async def release(self, resource: str, owner: str, fence: int) -> bool:
        """End a live lease at once, keeping its fence. False if it was not held.

        Raises:
            Unavailable: no answer; the release may have happened.
        """
        item = (policy.check_resource(resource), policy.check_owner(owner),
                policy.check_fence(fence))
        answer = await self._releases(item)
        # its row (or another of its batch) was locked: made alone, waiting
        return await self._release_alone(item) if isinstance(answer, _Locked) else answer

    def abandon(self, resource: str, owner: str, ttl: float) -> None:
        """End, in the background, whatever lease ``owner`` may hold on
        ``resource`` after a claim whose answer never came: the caller never
        learnt the fence, so nobody could renew or release it, and it would
        keep the resource for its whole ttl. Only for an owner made up for that
        one claim: a shared owner's other lease would be ended too.

        The database also remembers the owner as abandoned: the claim's
        statement may still be on its way (the driver drops a connection whose
        cancel request goes unanswered, and the database may yet run what it
        had been sent), and a claim under an abandoned owner is refused
        whenever it lands. So one answer settles it; while the database cannot
        be reached, it is tried again for the whole ttl (``close`` waits for
        it ``RELEASE_ON_CLOSE_SECONDS``)."""
        self._in_background(self._abandon(resource, owner, ttl))

    async def _abandon(self, resource: str, owner: str, ttl: float) -> None:
        give_up = clock.now() + ttl  # by then it has expired by itself
        while clock.now() < give_up:
            try:
                async with asyncio.timeout(max(ttl, 1.0)):
                    fence = await self.fetchval("abandon_claim", resource, owner)
            except (Unavailable, Busy, TimeoutError, asyncpg.PostgresError):
                # a refusal too (a statement timeout, a deadlock): nothing was
                # recorded, and a claim still on its way would be granted
                await asyncio.sleep(min(1.0, ttl / 10))
                continue
            if fence is not None:
                log.info("unanswered claim of %s abandoned (fence %s)", resource, fence,
                         extra={"resource": resource, "owner": owner, "fence": fence})
            return

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def release_after_loss(self, lease: Lease, pending: set[asyncio.Task[Any]]) -> None:
        """End a lease this process has given up, in the background.

        A renewal sent before the loss was declared may still land (a slow
        link) and extend the lease by a whole ttl, keeping the next owner
        waiting for nothing. Releasing it (owner and fence must match) ends it
        whichever comes first: a release before the late renewal makes that
        renewal fail, one after ends what it extended."""
        self._in_background(self._release_lost(lease, pending))

    async def _release_lost(self, lease: Lease, pending: set[asyncio.Task[Any]]) -> None:
        give_up = clock.now() + lease.ttl * 2
        if pending:  # release now, and again once the renewal under way has settled
            with contextlib.suppress(Unavailable, Busy, TimeoutError, asyncpg.PostgresError):
                await asyncio.wait_for(
                    self.release(lease.resource, lease.owner, lease.fence), lease.ttl)
            await asyncio.wait(pending, timeout=lease.ttl)
        while clock.now() < give_up:
            try:
                released = await asyncio.wait_for(
                    self.release(lease.resource, lease.owner, lease.fence), lease.ttl)
            # Busy: the pool stayed full; a refusal (a statement timeout, a
            # cancel) changed nothing
            except (Unavailable, Busy, TimeoutError, asyncpg.PostgresError):
                await asyncio.sleep(lease.policy.ttl * policy.DEFAULT_RETRY_FRACTION)
                continue
            if released:
                log.info("lost lease on %s (fence %s) released", lease.resource, lease.fence,
                         extra={
                    "resource": lease.resource, "owner": lease.owner, "fence": lease.fence})
            return

    async def show(self, resource: str) -> LeaseInfo | None:
        """The resource's lease row (live or not), or None if it was never
        claimed.

        Raises:
            Unavailable: no answer from the database.
        """
        row = await self.fetchrow("show_lease", policy.check_resource(resource))
        if row is None:
            return None
        return LeaseInfo(row["resource"], row["owner"], row["fence"], row["expires_at"],
                         row["live"])

