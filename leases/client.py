"""The lease client workers embed: ``LeaseClient`` and ``Lease``."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import asyncpg

from . import database, policy, sql
from .errors import LeaseLost, LostReason
from .metrics import LEASE_CLAIMS, LEASE_RENEWALS

log = logging.getLogger("fencegate.leases")

#: errors that mean "no answer from the database", as opposed to a refusal
UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.ConnectionDoesNotExistError,
)

DEFAULT_POOL_SIZE = 10
DEFAULT_COMMAND_TIMEOUT = 30.0


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
    client.connect()``); ``LeaseClient(pool=pool)`` borrows one.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        owner: str | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        if (dsn is None) == (pool is None):
            raise ValueError("give either dsn or pool")
        self._dsn = dsn
        self._pool = pool
        self._own_pool = pool is None
        self._pool_size = pool_size
        self._connect_lock = asyncio.Lock()
        self.owner = policy.check_owner(owner) if owner else policy.default_owner()

    async def connect(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._connect_lock:
                if self._pool is None:
                    assert self._dsn is not None
                    self._pool = await database.create_pool(
                        self._dsn,
                        min_size=1,
                        max_size=self._pool_size,
                        command_timeout=DEFAULT_COMMAND_TIMEOUT,
                    )
        return self._pool

    async def close(self) -> None:
        if self._own_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def __aenter__(self) -> LeaseClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        pool = await self.connect()
        return await pool.fetchrow(sql.query(name), *args)

    async def claim(
        self,
        resource: str,
        ttl: float,
        *,
        owner: str | None = None,
        policy_: policy.RenewalPolicy | None = None,
    ) -> Lease | None:
        """Claim ``resource`` for ``ttl`` seconds; ``None`` if someone else holds it."""
        owner = policy.check_owner(owner) if owner else self.owner
        ttl = policy.check_ttl(ttl)
        policy.check_resource(resource)
        sent_at = time.monotonic()
        row = await self._fetchrow("claim_lease", resource, owner, ttl)
        if row is None:
            LEASE_CLAIMS.labels(result="held").inc()
            return None
        LEASE_CLAIMS.labels(result="won").inc()
        return Lease(
            self, row["resource"], row["owner"], row["fence"], row["expires_at"],
            ttl, sent_at, policy_ or policy.RenewalPolicy(ttl),
        )

    async def renew(
        self, resource: str, owner: str, fence: int, ttl: float
    ) -> dt.datetime | None:
        """Extend a live lease held by ``owner`` under ``fence``; its new expiry, or
        ``None`` when the lease is no longer theirs."""
        row = await self._fetchrow(
            "renew_lease", policy.check_resource(resource), policy.check_owner(owner),
            policy.check_fence(fence), policy.check_ttl(ttl),
        )
        LEASE_RENEWALS.labels(result="ok" if row else "lost").inc()
        return None if row is None else row["expires_at"]

    async def release(self, resource: str, owner: str, fence: int) -> bool:
        """End a live lease at once, keeping its fence. False if it was not held."""
        row = await self._fetchrow(
            "release_lease", policy.check_resource(resource), policy.check_owner(owner),
            policy.check_fence(fence),
        )
        return row is not None

    async def show(self, resource: str) -> LeaseInfo | None:
        row = await self._fetchrow("show_lease", policy.check_resource(resource))
        if row is None:
            return None
        return LeaseInfo(row["resource"], row["owner"], row["fence"], row["expires_at"],
                         row["live"])


class Lease:
    """One claimed lease. ``async with lease:`` keeps it renewed and, the moment
    ownership cannot be proven, cancels the block and raises ``LeaseLost``.

    When the block ends (normally or by an error) the lease is released.
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
        self.deadline = renewal.deadline(sent_at)
        self._next_renewal = renewal.next_renewal(sent_at)
        self._lost: LeaseLost | None = None
        self._released = False
        self._guarded: asyncio.Task[Any] | None = None
        self._cancelled_guarded = False
        self._keeper: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._failures = 0  # renewals in a row that got no answer

    def __repr__(self) -> str:
        return f"Lease({self.resource!r}, owner={self.owner!r}, fence={self.fence})"

    @property
    def lost(self) -> LeaseLost | None:
        """Why the lease was lost, or ``None`` while it is held."""
        if self._lost is None and time.monotonic() >= self.deadline:
            self._lose("unreachable" if self._failures else "expired",
                       "local safety deadline passed")
        return self._lost

    def check(self) -> None:
        """Raise ``LeaseLost`` unless the lease is still provably ours."""
        lost = self.lost
        if lost is not None:
            raise lost
        if self._released:
            raise LeaseLost(self.resource, self.fence, "taken", "released")

    async def renew(self) -> None:
        """Renew once now; raises ``LeaseLost`` when refused."""
        self.check()
        sent_at = time.monotonic()
        expires_at = await self.client.renew(self.resource, self.owner, self.fence, self.ttl)
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

    def _lose(self, reason: LostReason, detail: str) -> None:
        if self._lost is not None:
            return
        self._lost = LeaseLost(self.resource, self.fence, reason, detail)
        log.warning("lease lost", extra={"resource": self.resource, "fence": self.fence,
                                         "reason": reason})
        if self._guarded is not None and not self._guarded.done():
            self._cancelled_guarded = True
            self._guarded.cancel(msg="fencegate: lease lost")

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        while self._lost is None:
            now = time.monotonic()
            wake = min(self._next_renewal, self.deadline)
            if wake > now:
                await asyncio.sleep(wake - now)
            sent_at = time.monotonic()
            if sent_at >= self.deadline:
                # woke too late: the process was paused, or failed renewals ran out the clock
                reason: LostReason = "unreachable" if self._failures else "expired"
                self._lose(reason, "safety deadline passed without a successful renewal")
                return
            attempt = loop.create_task(
                self.client.renew(self.resource, self.owner, self.fence, self.ttl)
            )
            # Not wait_for: cancelling a query on a dead connection can itself
            # hang, and the loss must be declared on time regardless.
            await asyncio.wait({attempt}, timeout=self.deadline - sent_at)
            if not attempt.done():
                self._pending.add(attempt)
                attempt.add_done_callback(self._forget)
                attempt.cancel()
                self._lose("unreachable", "renewal got no answer before the safety deadline")
                return
            error = attempt.exception()
            if error is None:
                expires_at = attempt.result()
                if expires_at is None:
                    self._lose("taken", "renewal refused: expired or claimed by another owner")
                    return
                self._failures = 0
                self._confirmed(sent_at, expires_at)
            elif isinstance(error, UNREACHABLE_ERRORS):
                self._failures += 1
                log.info("lease renewal failed, retrying", extra={"resource": self.resource})
                self._next_renewal = self.policy.retry_at(time.monotonic(), self.deadline)
            else:
                self._lose("unreachable", f"renewal failed: {type(error).__name__}")
                return

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it

    async def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None and not keeper.done():
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def __aenter__(self) -> Lease:
        self.check()
        self._guarded = asyncio.current_task()
        self._keeper = asyncio.get_running_loop().create_task(self._keep())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        await self._stop_keeper()
        guarded, self._guarded = self._guarded, None
        lost = self._lost
        if lost is None:
            if not self._released:
                with contextlib.suppress(*UNREACHABLE_ERRORS):
                    await self.release()  # best effort: otherwise it lapses at expiry
            return False
        if self._cancelled_guarded and guarded is not None and guarded.uncancel() > 0:
            return False  # cancelled from outside too: let that cancellation go on
        raise lost from (None if exc_type is asyncio.CancelledError else exc)
