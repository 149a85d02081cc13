"""The lease client workers embed: ``LeaseClient`` and ``Lease``."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import secrets
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import asyncpg

from . import clock, database, policy, sql
from .alarm import Alarm
from .batch import Batcher
from .errors import Busy, LeaseLost, LostReason, Unavailable
from .metrics import LEASE_CLAIMS, LEASE_RENEWALS, POOL_BUSY, POOL_WAIT

log = logging.getLogger("fencegate.leases")
#: every claim, won or lost (DEBUG: turn it on to see who got which fence)
claims_log = logging.getLogger("fencegate.leases.claims")

DEFAULT_POOL_SIZE = 10
DEFAULT_COMMAND_TIMEOUT = 30.0
#: how long a call waits for a free connection of the pool, by default
DEFAULT_ACQUIRE_TIMEOUT = 10.0
#: connections kept for renewals and releases (see LeaseClient._keeping)
KEEPING_POOL_SIZE = 2
#: at close, how long releases of lost leases may still take
RELEASE_ON_CLOSE_SECONDS = 2.0
#: a lost lease's block is cancelled again this often until it has exited
RECANCEL_SECONDS = 0.005
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


class LeaseClient:
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
        self._fixed_owner = owner is not None
        self.owner = policy.check_owner(owner) if owner else policy.default_owner()
        self._background: set[asyncio.Task[None]] = set()
        # concurrent claims, renewals and releases of this process share
        # statements and commits (leases/batch.py)
        self._claims: Batcher[tuple[str, str, float], asyncpg.Record | None] = \
            Batcher(self._claim_batch, name="claim")
        self._renewals: Batcher[tuple[str, str, int, float, float],
                                dt.datetime | None | _Locked] = \
            Batcher(self._renew_batch, name="renew")
        self._releases: Batcher[tuple[str, str, int], bool | _Locked] = \
            Batcher(self._release_batch, name="release")

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
        """Stop renewing, finish the releases of lost leases still under way
        (briefly), and close the pool this client opened (not a borrowed one)."""
        if self._background:  # releases of lost leases still under way
            await asyncio.wait(set(self._background), timeout=RELEASE_ON_CLOSE_SECONDS)
            for task in set(self._background):
                task.cancel()
        for attr in ("_pool", "_keeping"):
            pool = getattr(self, attr)
            if self._own_pool and pool is not None:
                setattr(self, attr, None)
                await pool.close()

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

    @contextlib.asynccontextmanager
    async def _connection(self, keeping: bool = False) -> AsyncIterator[asyncpg.Connection]:
        """A connection of the pool, or ``Busy`` when none came free in time
        (nothing was sent), or ``Unavailable`` when none could be made."""
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

    async def fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        """Run the statement ``name`` of leases/sql; its rows."""
        async with self._connection() as conn:
            rows: list[asyncpg.Record] = await conn.fetch(sql.query(name), *args)
            return rows

    async def fetchrow(self, name: str, *args: Any, keeping: bool = False,
                       ) -> asyncpg.Record | None:
        """Run the statement ``name`` of leases/sql; its first row, or None."""
        async with self._connection(keeping) as conn:
            row: asyncpg.Record | None = await conn.fetchrow(sql.query(name), *args)
            return row

    async def fetchval(self, name: str, *args: Any) -> Any:
        """Run the statement ``name`` of leases/sql; its first value."""
        async with self._connection() as conn:
            return await conn.fetchval(sql.query(name), *args)

    async def fetch_keeping(self, name: str, *args: Any) -> list[asyncpg.Record]:
        """``fetch`` on the connections kept for renewals and releases."""
        async with self._connection(keeping=True) as conn:
            rows: list[asyncpg.Record] = await conn.fetch(sql.query(name), *args)
            return rows

    async def _claim_batch(self, items: Sequence[tuple[str, str, float]],
                           ) -> list[asyncpg.Record | None]:
        if len(items) == 1:
            return [await self.fetchrow("claim_lease", *items[0])]
        rows = await self.fetch("claim_leases", [i[0] for i in items], [i[1] for i in items],
                                [i[2] for i in items])
        won = {r["ord"]: r for r in rows}
        return [won.get(n + 1) for n in range(len(items))]

    async def _renew_batch(self, items: Sequence[tuple[str, str, int, float, float]],
                           ) -> list[dt.datetime | None | _Locked]:
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
            if len(items) == 1:
                one = await self.fetchrow("release_lease", *items[0], LOCK_WAIT_SECONDS,
                                          keeping=True)
                return [one is not None]
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

    async def execute(self, name: str, *args: Any) -> int:
        """Run a statement; how many rows it touched."""
        async with self._connection() as conn:
            status: str = await conn.execute(sql.query(name), *args)
            return int(status.split()[-1])

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


class Lease:
    """One claimed lease. ``async with lease:`` keeps it renewed and, the moment
    ownership cannot be proven, cancels the block and raises ``LeaseLost``.

    When the block ends (normally or by an error) the lease is released; a
    lease lost because renewals got no answer, or because the process was
    paused, is released in the background too (see ``release_after_loss``).

    The exact guarantee, once the local deadline has passed (measured on a
    clock that counts pauses and suspend):

    - the block is cancelled, and cancelled again until it has exited;
    - it runs at most the one step (the code between two ``await``s) that was
      already scheduled when the loss was noticed: a wakeup queued just before
      a pause, or a result ``asyncio.wait_for`` let through on Python 3.11.
      On Linux the deadline alarm is seen before any event-loop timer that
      fell due during a pause, so a block sleeping or waiting on a socket
      through the pause does not even run that step;
    - ``lease.check()`` raises ``LeaseLost`` in that step. Call it right before
      any side effect that does not go through the gateway (the gateway
      checks the fence itself).
    """

    def __init__(
        self,
        client: LeaseClient,
        resource: str,
        owner: str,
        fence: int,
        expires_at: dt.datetime,
        ttl: float,
        sent_at: float,
        renewal: policy.RenewalPolicy,
    ) -> None:
        self.client = client
        self.resource = resource
        self.owner = owner
        self.fence = fence
        self.expires_at = expires_at
        self.ttl = ttl
        self.policy = renewal
        #: the last moment (``leases.clock.now()``) this holder may act
        self.deadline = renewal.deadline(sent_at)
        self._next_renewal = renewal.next_renewal(sent_at)
        self._lost: LeaseLost | None = None
        self._released = False
        self._guarded: asyncio.Task[Any] | None = None
        self._cancels = 0  # cancellations of the guarded task, to take back at exit
        self._recancel: asyncio.Handle | None = None
        self._exiting = False
        self._keeper: asyncio.Task[None] | None = None
        self._alarm: Alarm | None = None
        self._renewing: asyncio.Task[Any] | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._failures = 0  # renewals in a row that got no answer

    def __repr__(self) -> str:
        return f"Lease({self.resource!r}, owner={self.owner!r}, fence={self.fence})"

    @property
    def lost(self) -> LeaseLost | None:
        """Why the lease was lost, or ``None`` while it is held."""
        if self._lost is None and clock.now() >= self.deadline:
            self._deadline_passed()
        return self._lost

    def check(self) -> None:
        """Raise ``LeaseLost`` unless the lease is still provably ours. Cheap and
        synchronous: call it right before acting."""
        lost = self.lost
        if lost is not None:
            raise lost
        if self._released:
            raise LeaseLost(self.resource, self.fence, "taken", "released")

    async def renew(self) -> None:
        """Renew once now; raises ``LeaseLost`` when refused."""
        self.check()
        sent_at = clock.now()
        expires_at = await self.client.renew(self.resource, self.owner, self.fence, self.ttl,
                                             margin=self.policy.margin)
        if expires_at is None:
            self._lose("taken", "renewal refused")
            self.check()
        else:
            self._confirmed(sent_at, expires_at)

    def ended_elsewhere(self) -> None:
        """The lease was ended by another statement (a job's complete or fail):
        leaving the block has nothing left to release."""
        self._released = True

    async def release(self) -> bool:
        """Release now (and stop renewing)."""
        await self._stop_keeper()
        if self._released or self._lost is not None:
            return False
        self._released = True
        return await self.client.release(self.resource, self.owner, self.fence)

    def _confirmed(self, sent_at: float, expires_at: dt.datetime) -> None:
        self.expires_at = expires_at
        self.deadline = max(self.deadline, self.policy.deadline(sent_at))
        self._next_renewal = self.policy.next_renewal(sent_at)
        if self._alarm is not None:
            self._alarm.set(self.deadline)

    def _deadline_passed(self) -> None:
        renewing = self._renewing is not None and not self._renewing.done()
        self._lose("unreachable" if self._failures or renewing else "expired",
                   "local safety deadline passed without a successful renewal")

    def _lose(self, reason: LostReason, detail: str) -> None:
        if self._lost is not None:
            return
        self._lost = LeaseLost(self.resource, self.fence, reason, detail)
        log.warning("lease on %s (fence %s, owner %s) lost: %s (%s)", self.resource,
                    self.fence, self.owner, reason, detail, extra={
                        "resource": self.resource, "owner": self.owner, "fence": self.fence,
                        "reason": reason})
        if self._alarm is not None:
            self._alarm.close()
        renewing, self._renewing = self._renewing, None
        if renewing is not None and not renewing.done():
            # it may still land: release_after_loss waits for it
            self._pending.add(renewing)
            renewing.add_done_callback(self._forget)
            renewing.cancel()
        self._cancel_guarded()
        if self._keeper is not None and self._keeper is not asyncio.current_task():
            self._keeper.cancel()

    def _cancel_guarded(self) -> None:
        """Cancel the block, and again every few milliseconds until it exits:
        once is not always enough (on Python 3.11, ``asyncio.wait_for``
        swallows a cancellation that arrives in the same turn as its result,
        which is what a pause produces).

        Noticed from inside the block itself (its own ``check()``, or the
        SIGCONT handler of leases/alarm.py, which runs in whatever step was
        running when the process continued), the task cannot be cancelled
        there and then: the cancellation goes first in the loop's ready queue,
        ahead of the block's own wakeup, so it lands at the block's next
        await."""
        guarded = self._guarded
        if guarded is None or guarded.done() or self._exiting:
            return
        loop = asyncio.get_running_loop()
        if guarded is asyncio.current_task():
            if self._recancel is None:
                self._recancel = loop.call_soon(self._cancel_guarded)
            return
        self._cancels += 1
        guarded.cancel(msg="fencegate: lease lost")
        # the next turns first (a swallowed cancellation leaves the block one
        # step at most), then a slower pace for a block that ignores them
        self._recancel = loop.call_later(RECANCEL_SECONDS, self._cancel_guarded) \
            if self._cancels > 3 else loop.call_soon(self._cancel_guarded)

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        while self._lost is None:
            now = clock.now()
            wake = min(self._next_renewal, self.deadline)
            if wake > now:
                await asyncio.sleep(wake - now)
            sent_at = clock.now()
            if sent_at >= self.deadline:
                # woke too late: the process was paused, or failed renewals ran out the clock
                self._deadline_passed()
                return
            attempt = loop.create_task(
                self.client.renew(self.resource, self.owner, self.fence, self.ttl,
                                  margin=self.policy.margin)
            )
            self._renewing = attempt
            # Not wait_for: cancelling a query on a dead connection can itself
            # hang, and the loss must be declared on time regardless.
            await asyncio.wait({attempt}, timeout=self.deadline - sent_at)
            if not attempt.done():
                self._lose("unreachable", "renewal got no answer before the safety deadline")
                return
            self._renewing = None
            error = attempt.exception()
            if error is None:
                expires_at = attempt.result()
                if expires_at is None:
                    self._lose("taken", "renewal refused: expired or claimed by another owner")
                    return
                self._failures = 0
                self._confirmed(sent_at, expires_at)
            elif isinstance(error, Unavailable | Busy | asyncpg.PostgresError):
                # no answer, or a refusal (a deadlock, a statement timeout, a
                # cancel): nothing was changed, so try again while the
                # deadline lasts; the lease is lost only when it passes
                self._failures += 1
                log.info("renewal of %s (fence %s) got no answer or was refused, retrying",
                         self.resource, self.fence, extra={
                    "resource": self.resource, "owner": self.owner, "fence": self.fence,
                    "error": type(error).__name__})
                self._next_renewal = self.policy.retry_at(clock.now(), self.deadline)
            else:
                self._lose("unreachable", f"renewal failed: {type(error).__name__}")
                return

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it

    async def _stop_keeper(self) -> None:
        if self._alarm is not None:
            self._alarm.close()
        keeper, self._keeper = self._keeper, None
        if keeper is not None and not keeper.done():
            keeper.cancel()
            # wait() rather than await: the keeper's CancelledError stays in
            # it, and one of this task (cancelled as the block ends) comes out
            await asyncio.wait({keeper})

    async def __aenter__(self) -> Lease:
        self.check()
        self._guarded = asyncio.current_task()
        self._alarm = Alarm(self._deadline_passed)
        self._alarm.set(self.deadline)
        self._keeper = asyncio.get_running_loop().create_task(self._keep())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._exiting = True
        if self._recancel is not None:
            self._recancel.cancel()
        guarded, self._guarded = self._guarded, None
        lost = self._lost
        if lost is None:
            try:
                await self._stop_keeper()
            except asyncio.CancelledError:  # the task is cancelled as the block ends
                if not self._released and self._lost is None:
                    self._released = True
                    self.client.release_after_loss(self, set())  # in the background
                raise
            if not self._released:
                # best effort: otherwise it lapses at expiry (a refusal too:
                # a statement timeout or a cancel changed nothing)
                with contextlib.suppress(Unavailable, Busy, asyncpg.PostgresError):
                    await self.release()
            return False
        # lost: nothing more is awaited here, so nothing more can be cancelled
        if self._alarm is not None:
            self._alarm.close()
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
        if lost.reason != "taken" and not self._released:
            self.client.release_after_loss(self, set(self._pending))
        outside = 0
        if guarded is not None:
            for _ in range(self._cancels):  # take our cancellations back
                outside = guarded.uncancel()
        if self._cancels and outside > 0:
            return False  # cancelled from outside too: let that cancellation go on
        # the block's own error is the cause, unless it is the loss itself
        # (its check() raised it) or the cancellation the loss made
        raise lost from (None if exc_type is asyncio.CancelledError or exc is lost else exc)
