"""``Worker``: runs a handler over a queue with bounded concurrency.

Each job runs inside its lease (``async with job.lease``): renewed in the
background, and cancelled the moment ownership cannot be proven. Complete and
fail happen inside the lease too, so the lease never lapses between the work
and its record (leases/completion.py records them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import Awaitable, Callable

import asyncpg

from . import database, observe, policy
from .completion import Recorder, still_ours
from .errors import Busy, LeaseLost, Unavailable
from .queue import MAX_BATCH, Job, Queue
from .queue_admin import Snooze

log = logging.getLogger("fencegate.worker")

Handler = Callable[[Job], Awaitable[str | None]]

DEFAULT_CONCURRENCY = 4
DEFAULT_TTL_SECONDS = 30.0
DEFAULT_POLL_MIN_SECONDS = 0.05
DEFAULT_POLL_MAX_SECONDS = 2.0
DEFAULT_GRACE_SECONDS = 30.0
DEFAULT_BACKSTOP_SECONDS = 10.0
LISTEN_TIMEOUT_SECONDS = 5.0
#: where a cancel of a claimed job is announced (fencegate_cancel_jobs)
CANCEL_CHANNEL = "fencegate_jobs_cancelled"
#: finished jobs past the queue's retention are purged this often
DEFAULT_PURGE_INTERVAL_SECONDS = 600.0
#: ":" and 8 hex digits: each claim's owner is the worker's with a part of its own
CLAIM_SUFFIX_LENGTH = 9


class Worker:
    """Process ``queue`` with ``handler``; the handler's return value (if any) is
    stored as the job's ``result_ref``."""

    def __init__(
        self,
        queue: Queue,
        handler: Handler,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        ttl: float = DEFAULT_TTL_SECONDS,
        poll_min: float = DEFAULT_POLL_MIN_SECONDS,
        poll_max: float = DEFAULT_POLL_MAX_SECONDS,
        grace: float = DEFAULT_GRACE_SECONDS,
        backstop_interval: float = DEFAULT_BACKSTOP_SECONDS,
        purge_interval: float = DEFAULT_PURGE_INTERVAL_SECONDS,
        owner: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = observe.DEFAULT_HOST,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.ttl = ttl
        self.poll_min, self.poll_max = poll_min, poll_max
        self.grace = grace
        self.backstop_interval = backstop_interval
        self.purge_interval = purge_interval
        self.owner = owner or queue.client.owner
        if len(self.owner) > policy.MAX_OWNER_LENGTH - CLAIM_SUFFIX_LENGTH:
            raise ValueError(f"a worker's owner must be at most "
                             f"{policy.MAX_OWNER_LENGTH - CLAIM_SUFFIX_LENGTH} characters")
        #: the owner of a claim that got no answer (it may have committed):
        #: what it claimed is still to be taken up
        self._unanswered: str | None = None
        self._ends = Recorder(queue)
        self._stopping = asyncio.Event()
        #: what a handler raised to end the process (SystemExit,
        #: KeyboardInterrupt): raised by run() once shutdown is done
        self._exit: BaseException | None = None
        self._jobs_arrived = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        #: one token per run of a job whose handler runs (or has not yet been
        #: called): the slots taken. A run whose completion is being recorded
        #: no longer takes one. (Not the job id: a job that failed can be
        #: claimed again, and run again, before its first run has ended.)
        self._handling: set[object] = set()
        #: each run's job, by its slot: a cancel announced for its resource
        #: makes its lease check at once
        self._jobs: dict[object, Job] = {}
        self._checks: set[asyncio.Task[None]] = set()
        self._slot_free = asyncio.Event()
        #: set after every backstop pass (a test hook)
        self.backstop_passed = asyncio.Event()
        #: with ``metrics_port``, /metrics is served there while ``run()`` runs
        #: (this process's counters and the queue gauges; port 0 picks one)
        self.metrics_port, self.metrics_host = metrics_port, metrics_host
        #: the running metrics endpoint (``.port``), once ``run()`` has started it
        self.metrics: observe.MetricsServer | None = None

    def stop(self) -> None:
        """Stop claiming; in-flight jobs get the grace period to finish."""
        self._stopping.set()

    async def run(self, *, handle_signals: bool = False) -> None:
        """Claim and process until ``stop()`` (or SIGTERM/SIGINT with
        ``handle_signals``), then shut down gracefully.

        A handler that raises ``SystemExit`` or ``KeyboardInterrupt`` stops
        the worker the same way (its own job is not recorded as failed; its
        lease is released); once the other jobs are done, ``run()`` raises
        that exception."""
        loop = asyncio.get_running_loop()
        if self.metrics_port is not None:
            self.metrics = await observe.serve(self.metrics_port, host=self.metrics_host,
                                               client=self.queue.client,
                                               queues=[self.queue.name])
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        backstop = loop.create_task(self._backstop())
        stop_listening = await self._listen()
        try:
            await self._claim_loop()
        finally:
            if stop_listening is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(stop_listening(), 5)
            backstop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await backstop
            await self._shutdown()
            if self.metrics is not None:
                await self.metrics.close()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        leaving, self._exit = self._exit, None
        if leaving is not None:
            raise leaving

    async def _claim_loop(self) -> None:
        idle = self.poll_min
        while not self._stopping.is_set():
            # handlers at most `concurrency`; runs whose completions are still
            # being recorded (a slow database) at most as many again; one
            # claim takes at most MAX_BATCH (a wider worker claims again)
            free = min(self.concurrency - len(self._handling),
                       2 * self.concurrency - len(self._running), MAX_BATCH)
            if free <= 0:
                self._slot_free.clear()
                await self._wait(self._slot_free.wait(), None)
                continue
            # each claim under an owner of its own: after no answer, what that
            # one claim took (and nothing else) is found by its owner
            owner = self._unanswered or f"{self.owner}:{secrets.token_hex(4)}"
            try:
                if self._unanswered:
                    jobs = await self._take_up(owner)
                else:
                    jobs = await self.queue.claim(owner, limit=free, ttl=self.ttl)
            except Exception as exc:
                # no answer: the claim may have committed (an attempt counted,
                # under a fence only the answer carried); look next time
                if isinstance(exc, Unavailable):
                    self._unanswered = owner
                # unreachable, read-only after a failover, a statement timeout,
                # a deadlock: none of it ends the worker; it backs off and retries
                log.warning("claim failed: %s", exc, extra={
                    "queue": self.queue.name, "error": type(exc).__name__},
                    exc_info=not isinstance(exc, Unavailable))
                jobs = []
            for job in jobs:
                slot = object()
                self._handling.add(slot)
                self._jobs[slot] = job
                task = asyncio.get_running_loop().create_task(self._process(job, slot))
                self._running.add(task)
                task.add_done_callback(self._done)
            if jobs:
                idle = self.poll_min
            else:
                self._jobs_arrived.clear()
                await self._wait(self._jobs_arrived.wait(), idle)
                idle = self.poll_min if self._jobs_arrived.is_set() \
                    else min(self.poll_max, idle * 2)

    async def _take_up(self, owner: str) -> list[Job]:
        """The jobs a claim that got no answer did claim, under ``owner``, the
        claim's own: they run now rather than wait out their lease and lose
        the attempt it counted. (No more than the claim asked for, when as many
        slots were free; runs since have only ended.)"""
        jobs = await self.queue.claimed_by(owner, self.ttl)
        self._unanswered = None
        if jobs:
            log.info("took up %d job(s) of queue %s claimed by a claim that got no answer",
                     len(jobs), self.queue.name, extra={
                         "queue": self.queue.name, "owner": owner,
                         "jobs": [j.id for j in jobs]})
        return jobs

    async def _wait(self, aw: Awaitable[object], timeout: float | None) -> None:
        """Wait for ``aw`` or for stop(), whichever comes first (or ``timeout``)."""
        waiter = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({waiter, stopper}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        for t in (waiter, stopper):
            t.cancel()

    async def _listen(self) -> Callable[[], Awaitable[None]] | None:
        """LISTEN for new jobs on a connection held for the purpose, to wake
        from an idle poll at once; answers how to stop. Optional: where it
        cannot be had (PgBouncer in transaction mode, a database down at start)
        polling does the work alone."""
        def arrived(conn: object, pid: int, channel: str, queue: str) -> None:
            if queue == self.queue.name:
                self._jobs_arrived.set()

        def cancelled(conn: object, pid: int, channel: str, resource: str) -> None:
            self._cancelled(resource)

        try:
            async with database.answered(LISTEN_TIMEOUT_SECONDS):
                pool = await self.queue.client.connect()
                conn = await pool.acquire()
        except (Unavailable, asyncpg.PostgresError) as exc:
            log.info("no LISTEN for new jobs; polling only", extra={
                "queue": self.queue.name, "error": type(exc).__name__})
            return None
        try:
            async with database.answered(LISTEN_TIMEOUT_SECONDS):
                await conn.add_listener("fencegate_jobs", arrived)
                await conn.add_listener(CANCEL_CHANNEL, cancelled)
        except (Unavailable, asyncpg.PostgresError):
            await pool.release(conn)
            return None

        async def stop() -> None:
            try:
                await conn.remove_listener("fencegate_jobs", arrived)
                await conn.remove_listener(CANCEL_CHANNEL, cancelled)
            finally:
                await pool.release(conn)

        return stop

    def _cancelled(self, resource: str) -> None:
        """A job was cancelled: if this worker runs it, renew its lease now
        rather than at the next renewal. The renewal is refused (the cancel
        ended the lease), so the lease enters lost-ownership mode and cancels
        the handler. Without LISTEN, the next scheduled renewal does the same."""
        for job in list(self._jobs.values()):
            if job.lease.resource == resource and job.lease.lost is None:
                task = asyncio.get_running_loop().create_task(self._check(job))
                self._checks.add(task)
                task.add_done_callback(self._checks.discard)

    async def _check(self, job: Job) -> None:
        with contextlib.suppress(LeaseLost, Unavailable, Busy, asyncpg.PostgresError):
            await job.lease.renew()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._slot_free.set()

    def _handled(self, slot: object) -> None:
        """A handler has returned: its slot is free for the next job while the
        completion is recorded (the claim of the next job and the completion
        of this one go to the database side by side)."""
        if slot in self._handling:
            self._handling.discard(slot)
            self._slot_free.set()

    async def _process(self, job: Job, slot: object) -> None:
        try:
            await self._run_job(job, slot)
        except (KeyboardInterrupt, SystemExit) as exc:
            # the process is to end: asyncio would let it out of the event
            # loop at once, abandoning every other job mid-run. The worker
            # stops as on stop() instead, and run() raises it at the end.
            log.warning("job %s of queue %s: the handler raised %s: the worker stops",
                        job.id, job.queue, type(exc).__name__, extra={
                            "queue": job.queue, "job": job.id, "fence": job.fence,
                            "error": type(exc).__name__})
            if self._exit is None:
                self._exit = exc
            self.stop()
        except Exception:
            # unforeseen (a bug here or in a Queue subclass): it ends this
            # run only, logged with its job rather than left in the task for
            # asyncio to report at garbage collection; the lease was released
            # on the way out, so recovery runs the job again
            log.exception("job %s of queue %s: its end could not be recorded", job.id,
                          job.queue, extra={"queue": job.queue, "job": job.id,
                                            "fence": job.fence})
        finally:
            self._jobs.pop(slot, None)
            self._handled(slot)

    async def _run_job(self, job: Job, slot: object) -> None:
        try:
            async with job.lease:
                try:
                    result = await self.handler(job)
                except Snooze as snooze:
                    if not job.snoozed:
                        still_ours(job)
                        await self._ends.snooze(job, snooze.seconds)
                except Exception as exc:
                    if job.snoozed:
                        return  # snoozed by the handler: this run is over
                    still_ours(job)
                    await self._ends.failure(job, exc)
                except asyncio.CancelledError as exc:
                    if self._cancelled_by_us(job):
                        raise
                    # the handler's own (an inner task it awaited was
                    # cancelled): a failed attempt like any other error
                    await self._ends.failure(job, exc)
                else:
                    if job.completed_in_transaction or job.snoozed:
                        return  # completed in its own transaction, or snoozed
                    still_ours(job)
                    await self._ends.end(job, result, lambda: self._handled(slot))
        except LeaseLost as lost:
            if isinstance(lost.__cause__, KeyboardInterrupt | SystemExit):
                raise lost.__cause__ from None  # raised in lost-ownership mode
            log.warning("job %s of queue %s: its lease (fence %s) was lost (%s), the handler "
                        "was cancelled", job.id, job.queue, job.fence, lost.reason,
                        extra={"queue": job.queue, "job": job.id, "fence": job.fence,
                               "owner": job.lease.owner, "reason": lost.reason})
        except (Unavailable, Busy, asyncpg.PostgresError) as exc:
            # completion could not be recorded (no answer, or a refusal such as
            # a statement timeout or a deadlock): the lease lapses and the job is
            # recovered and run again (at-least-once; effects are fenced)
            log.warning("could not record the job's end", extra={
                "queue": job.queue, "job": job.id, "error": type(exc).__name__})

    def _cancelled_by_us(self, job: Job) -> bool:
        """Whether a ``CancelledError`` out of the handler is the worker's:
        its task cancelled (the lease lost, or shutdown past the grace
        period), or raised while the worker is shutting down."""
        task = asyncio.current_task()
        return bool(task is not None and task.cancelling()) or \
            job.lease.lost is not None or self._stopping.is_set()

    async def _backstop(self) -> None:
        """Recover expired claims even when this worker is too busy to poll,
        and purge finished jobs past retention. Never dies."""
        loop = asyncio.get_running_loop()
        next_purge = loop.time()
        while True:
            await asyncio.sleep(self.backstop_interval)
            try:
                await self.queue.recover()
            except Exception as exc:
                log.warning("backstop recovery failed: %s", exc, extra={
                    "queue": self.queue.name, "error": type(exc).__name__})
            if loop.time() >= next_purge:
                next_purge = loop.time() + self.purge_interval
                try:
                    await self.queue.purge()
                except Exception as exc:
                    log.warning("purge failed: %s", exc, extra={
                        "queue": self.queue.name, "error": type(exc).__name__})
            self.backstop_passed.set()

    async def _shutdown(self) -> None:
        """In-flight jobs get the grace period to finish and be recorded;
        past it they are cancelled, completions still in flight too, so
        nothing of the worker's outlives run()."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        if self._running:
            _done, pending = await asyncio.wait(set(self._running), timeout=self.grace)
            for task in pending:  # past the grace period: their leases lapse
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self._ends.close(max(0.0, deadline - loop.time()))
        if self._checks:  # renewals asked for by cancels: short, but not left behind
            _done, late = await asyncio.wait(set(self._checks),
                                             timeout=max(0.0, deadline - loop.time()))
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
