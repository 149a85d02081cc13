"""``Lease``: one claimed lease, kept renewed inside ``async with``, and the
guarded block cancelled the moment ownership cannot be proven."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import asyncpg

from . import clock, fenced, policy
from .alarm import Alarm
from .errors import Busy, LeaseLost, LostReason, Unavailable

if TYPE_CHECKING:
    from .client import LeaseClient

log = logging.getLogger("fencegate.leases")

#: a lost lease's block is cancelled again this often until it has exited
RECANCEL_SECONDS = 0.005


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

    async def check_fence(self, conn: asyncpg.Connection) -> None:
        """The fence check in the caller's transaction on ``conn`` (a
        connection to the fencegate database): raises ``FenceRefused`` unless
        this lease's fence is current and the lease live by the database
        clock; passed, no newer fence of the resource is granted until that
        transaction ends. Raises ``LeaseLost`` first if the lease is already
        known lost here."""
        self.check()
        await fenced.check_fence(conn, self.resource, self.fence)

    @contextlib.asynccontextmanager
    async def transaction(self, conn: asyncpg.Connection,
                          **options: Any) -> AsyncIterator[asyncpg.Connection]:
        """``async with lease.transaction(conn):`` a transaction on ``conn``
        (asyncpg's ``options``: isolation, deferrable; not readonly, the
        check takes a row lock) whose writes
        commit only under this lease's fence: checked as it starts
        (``check_fence``), and again locally before the commit, so a lease
        lost meanwhile (lost-ownership mode) commits nothing. A refusal raises
        ``FenceRefused`` (a ``LeaseLost``) and rolls everything back.

        Keep the transaction short: while it is open the resource cannot be
        claimed by anyone else; once the lease has expired, the next claim
        ends the session."""
        async with conn.transaction(**options):
            await self.check_fence(conn)
            yield conn
            lost = self.lost  # no last commit once the lease is known lost
            if lost is not None:
                raise lost

    def ended_elsewhere(self) -> None:
        """The lease was ended by another statement (a job's complete or fail,
        or a completion written in the caller's transaction): it is not
        renewed any more, losing it cancels nothing, and leaving the block
        has nothing left to release."""
        self._released = True
        if self._alarm is not None:
            self._alarm.close()
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper is not asyncio.current_task():
            keeper.cancel()
        renewing, self._renewing = self._renewing, None
        if renewing is not None and not renewing.done():
            self._pending.add(renewing)
            renewing.add_done_callback(self._forget)

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
        if self._lost is not None or self._released:
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
