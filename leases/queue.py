"""The work queue: idempotent enqueue, batch claims that hand out fenced
leases, complete and fail conditioned on the fence, retries, dead letters,
per-key ordering, and recovery of expired claims."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from . import clock, fenced, policy
from . import enqueue as enqueuing
from .client import LeaseClient
from .enqueue import Enqueued as Enqueued
from .enqueue import NewJob as NewJob
from .errors import InvalidArgument
from .lease import Lease
from .metrics import AWAITING_PURGE, JOBS
from .queue_admin import QueueControl
from .retry import RetryPolicy, sanitize_error

log = logging.getLogger("fencegate.queue")
claims_log = logging.getLogger("fencegate.leases.claims")

QUEUE_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,100}")
#: claimers recover expired claims at most this often (per Queue object)
DEFAULT_RECOVERY_INTERVAL_SECONDS = 5.0
#: completed and dead jobs are kept this long, then purged with their leases
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0
MAX_BATCH = 1000
PURGE_BATCH = 1000


#: the states of a job (docs/leases.md, "A job's states"); `scheduled`, in
#: counts, is a `queued` job not yet due
JobState = Literal["queued", "claimed", "completed", "dead", "cancelled"]


@dataclass
class Job:
    """A claimed job: its row, and the lease on ``job:<queue>:<id>``."""

    id: int
    queue: str
    payload: Any
    attempts: int
    max_attempts: int
    fence: int
    dedupe_key: str | None
    ordering_key: str | None
    priority: int
    lease: Lease
    #: its completion was written in a caller's transaction (``complete(job,
    #: connection=)``): the worker does not complete it again
    completed_in_transaction: bool = False
    #: its run was put off (``queue.snooze``): the worker records nothing more
    snoozed: bool = False
    #: how often the job was snoozed before this run
    snoozes: int = 0

    @contextlib.asynccontextmanager
    async def transaction(self, conn: asyncpg.Connection,
                          **options: Any) -> AsyncIterator[asyncpg.Connection]:
        """``async with job.transaction(conn):`` a transaction on ``conn``
        whose writes commit only under this job's fence (``Lease.transaction``);
        ``await queue.complete(job, connection=conn)`` inside it completes the
        job in the same commit. Rolled back, it completed nothing: a worker
        whose handler then returns normally completes the job itself."""
        try:
            async with self.lease.transaction(conn, **options):
                yield conn
        except BaseException:
            self.completed_in_transaction = False
            raise

    @property
    def resource(self) -> str:
        """The job's lease resource, ``job:<queue>:<id>``: the gateway checks
        the job's fence on it like any lease's."""
        return job_resource(self.queue, self.id)


def error_text(error: BaseException | str) -> str:
    """``sanitize_error``, storable whatever the error holds: an exception
    whose ``__str__`` raises is named by its type, a NUL (which PostgreSQL
    text cannot hold) and lone surrogates (not UTF-8) are written as escapes.
    A failure is never lost to a statement refused for its message."""
    if not isinstance(error, str):
        try:
            message = str(error)
        except Exception:
            message = "(its message could not be read)"
        error = f"{type(error).__name__}: {message}"
    error = error.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return sanitize_error(error)


def job_resource(queue: str, job_id: int) -> str:
    return f"job:{queue}:{job_id}"


def check_queue(name: str) -> str:
    if not isinstance(name, str) or not QUEUE_PATTERN.fullmatch(name):
        raise InvalidArgument("queue names are 1 to 100 of A-Z a-z 0-9 . _ -")
    return name


class Queue(QueueControl):
    """One named queue on a ``LeaseClient``'s database."""

    def __init__(
        self,
        client: LeaseClient,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        recovery_interval: float = DEFAULT_RECOVERY_INTERVAL_SECONDS,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        rng: random.Random | None = None,
    ) -> None:
        if retention_seconds <= 0:
            raise InvalidArgument("retention_seconds must be positive")
        self.client = client
        self.name = check_queue(name)
        self.retry = retry or RetryPolicy()
        self.recovery_interval = recovery_interval
        self.retention_seconds = retention_seconds
        self._rng = rng or random.Random()
        self._last_recovery = float("-inf")
        self._recovering: asyncio.Task[None] | None = None

    async def enqueue(self, payload: Any, *, dedupe_key: str | None = None,
                      ordering_key: str | None = None, run_at: dt.datetime | None = None,
                      max_attempts: int | None = None, priority: int = 0,
                      unique_key: str | None = None, unique_for: float | None = None,
                      connection: asyncpg.Connection | None = None) -> int:
        """Add one job; its id. The same ``dedupe_key`` again answers the first
        job's id and adds nothing; so does a ``unique_key`` held by another
        job (for ``unique_for`` seconds, or while that job is not finished:
        ``NewJob``). With ``connection`` (the caller's, in its
        transaction), the job exists only if that transaction commits: the
        outbox, the business row and its job together or neither."""
        [job_id] = await self.enqueue_many([NewJob(payload, dedupe_key, ordering_key, run_at,
                                                   max_attempts, priority, unique_key,
                                                   unique_for)],
                                           connection=connection)
        return job_id

    async def enqueue_many(self, jobs: Sequence[NewJob], *,
                           connection: asyncpg.Connection | None = None) -> list[int]:
        """Add jobs in one statement; their ids, in order (a deduplicated job
        answers the existing job's id)."""
        return [done.id for done in await self.enqueue_reporting(jobs, connection=connection)]

    async def enqueue_reporting(self, jobs: Sequence[NewJob], *,
                                connection: asyncpg.Connection | None = None,
                                count: bool = True) -> list[Enqueued]:
        """``enqueue_many``, saying of each job whether it was deduplicated
        (by its dedupe key, or its unique key held: leases/enqueue.py).
        ``count`` False: not counted in ``fencegate_jobs_total`` here (the
        caller counts what its transaction kept, ``enqueue.counted``)."""
        return await enqueuing.enqueue(self.client, self.name, jobs, self.retry.max_attempts,
                                     connection, count=count)

    async def claim(self, owner: str | None = None, *, limit: int = 1,
                    ttl: float = 30.0) -> list[Job]:
        """Take up to ``limit`` runnable jobs, each leased for ``ttl`` seconds
        under its own fence. Nothing to do, or a lost race: an empty list."""
        owner = policy.check_owner(owner) if owner else self.client.owner
        ttl = policy.check_ttl(ttl)
        if not 1 <= limit <= MAX_BATCH:
            raise InvalidArgument(f"limit must be between 1 and {MAX_BATCH}")
        self._maybe_recover()
        sent_at = clock.now()
        rows = await self.client.fetch("claim_jobs", self.name, owner, limit, ttl)
        jobs = [self._job(r, owner, ttl, sent_at) for r in rows]
        if jobs:
            JOBS.labels(queue=self.name, event="claimed").inc(len(jobs))
        for job in jobs:
            claims_log.debug("job %s of queue %s claimed by %s: fence %s, attempt %d",
                             job.id, self.name, owner, job.fence, job.attempts, extra={
                                 "queue": self.name, "job": job.id, "owner": owner,
                                 "fence": job.fence, "attempt": job.attempts})
        return jobs

    async def claimed_by(self, owner: str, ttl: float) -> list[Job]:
        """The jobs ``owner`` holds a live claim on: after a claim that got no
        answer (it may have committed), what it claimed. Each lease counts as
        confirmed only for the time it had left when the database answered."""
        sent_at = clock.now()
        rows = await self.client.fetch("jobs_claimed_by", self.name, policy.check_owner(owner))
        # a lease with r seconds left, read after sent_at, is live until at
        # least sent_at + r: as if confirmed by a request sent at that, less ttl
        return [self._job(r, owner, ttl, sent_at - max(0.0, ttl - r["remaining"]))
                for r in rows]

    def _job(self, r: asyncpg.Record, owner: str, ttl: float, sent_at: float) -> Job:
        lease = Lease(self.client, job_resource(self.name, r["id"]), owner, r["fence"],
                      r["expires_at"], ttl, sent_at, policy.RenewalPolicy(ttl))
        return Job(r["id"], r["queue"], json.loads(r["payload"]), r["attempts"],
                   r["max_attempts"], r["fence"], r["dedupe_key"], r["ordering_key"],
                   r["priority"], lease, snoozes=r["snoozes"])

    async def complete(self, job: Job, result_ref: str | None = None, *,
                       connection: asyncpg.Connection | None = None) -> bool:
        """Mark the job done, if its fence is still current and its lease live.
        False: a newer claim owns it, or its lease lapsed (this holder was a
        zombie), and nothing changed.

        With ``connection`` (the caller's, in its transaction, e.g. inside
        ``job.transaction(conn)``) the completion commits with the caller's
        own writes: True, or ``FenceRefused`` (the transaction is aborted, so
        a zombie's writes roll back). The job's lease is no longer renewed from
        then on: should that transaction roll back after all, the lease lapses
        and the job runs again."""
        if connection is not None:
            async with fenced.refusals(job.lease.resource, job.fence):
                await self.client.fetchval("complete_job_in_transaction", self.name, job.id,
                                           job.fence, result_ref, connection=connection)
            job.completed_in_transaction = True
            job.lease.ended_elsewhere()
            JOBS.labels(queue=self.name, event="completed").inc()
            return True
        row = await self.client.fetchrow("complete_job", job.id, job.fence, result_ref)
        if row is not None:
            job.lease.ended_elsewhere()
            JOBS.labels(queue=self.name, event="completed").inc()
        return row is not None

    async def complete_many(self, done: Sequence[tuple[Job, str | None]]) -> set[int]:
        """``complete`` for a batch, in one statement: the ids that counted."""
        if not done:
            return set()
        rows = await self.client.fetch("complete_jobs", [j.id for j, _ in done],
                                [j.fence for j, _ in done], [ref for _, ref in done])
        counted = {r["id"] for r in rows}
        for job, _ in done:
            if job.id in counted:
                job.lease.ended_elsewhere()
        if counted:
            JOBS.labels(queue=self.name, event="completed").inc(len(counted))
        return counted

    async def fail(self, job: Job, error: BaseException | str, *,
                   connection: asyncpg.Connection | None = None,
                   ) -> Literal["queued", "dead"] | None:
        """Record a failed attempt, if the fence is still current and the lease
        live: answers ``"queued"`` (retried after a backoff), ``"dead"``, or
        ``None`` (stale: a newer claim, or a lapsed lease). With
        ``connection`` (the caller's, in its transaction) it is fenced as
        ``complete`` is: a stale fence raises ``FenceRefused``."""
        decision = self.retry.decide(job.attempts, job.max_attempts, self._rng)
        if connection is not None:
            await fenced.check_fence(connection, job.lease.resource, job.fence)
        state = await self.client.fetchval("fail_job", job.id, job.fence,
                                    error_text(error), decision.delay_seconds,
                                    connection=connection)
        if state is not None:
            job.lease.ended_elsewhere()
            JOBS.labels(queue=self.name, event="retried" if state == "queued" else "dead").inc()
        return state  # type: ignore[no-any-return]

    async def recover(self) -> int:
        """Return expired claims to the queue (or to the dead, after their last
        attempt); how many."""
        rows = await self.client.fetch("recover_jobs", self.name)
        dead = sum(1 for r in rows if r["state"] == "dead")
        if dead:
            JOBS.labels(queue=self.name, event="dead").inc(dead)
        for r in rows:  # who stopped renewing what, under which fence
            log.info("job %s of queue %s recovered from %s (fence %s): %s", r["id"], r["queue"],
                     r["claimed_by"], r["fence"], "dead, its last attempt"
                     if r["state"] == "dead" else "back in the queue", extra={
                         "queue": r["queue"], "job": r["id"], "owner": r["claimed_by"],
                         "fence": r["fence"], "now": r["state"]})
        return len(rows)

    def _maybe_recover(self) -> None:
        """On the polling path: at most every ``recovery_interval``, in the
        background, so the poll is neither slowed nor failed by it."""
        now = time.monotonic()
        if now - self._last_recovery < self.recovery_interval:
            return
        if self._recovering is not None and not self._recovering.done():
            return
        self._last_recovery = now
        self._recovering = asyncio.get_running_loop().create_task(self._recover_quietly())

    async def _recover_quietly(self) -> None:
        try:
            await self.recover()
        except Exception as exc:  # never fail the poll; the backstop will retry
            log.warning("recovery failed", extra={"queue": self.name,
                                                  "error": type(exc).__name__})

    async def purge(self, batch: int = PURGE_BATCH) -> int:
        """Delete this queue's jobs completed or dead for longer than the
        retention, with their leases, in batches until caught up; how many.
        (Leases still live or draining stay, with their job, until later.)"""
        total = 0
        while True:
            done = await self.client.execute("purge_jobs", self.retention_seconds, batch,
                                             self.name)
            total += done
            if done < batch:
                break
            await asyncio.sleep(0)
        left = await self.client.fetchval("jobs_awaiting_purge", self.retention_seconds)
        AWAITING_PURGE.labels(table="jobs").set(left)
        if total:
            log.info("purged finished jobs", extra={"queue": self.name, "jobs": total})
        return total

    async def replay(self, job_ids: Sequence[int] | None = None, *, batch: int = 500,
                     progress: Callable[[int], None] | None = None) -> int:
        """Dead jobs back to the queue with attempts reset: the ones given, or
        all of this queue's (in batches of ``batch``); how many."""
        ids = list(job_ids) if job_ids is not None else None
        total = 0
        while True:
            rows = await self.client.fetch("replay_jobs", self.name, ids, batch)
            total += len(rows)
            if progress is not None:
                progress(total)
            if len(rows) < batch:
                break
        if total:
            JOBS.labels(queue=self.name, event="replayed").inc(total)
        return total

    async def list(self, state: JobState | None = None,
                   limit: int = 100) -> list[dict[str, Any]]:
        """This queue's jobs (only those in ``state``, when given), at most
        ``limit``, as dicts of their columns (the payload decoded).

        Raises:
            Unavailable: the database gave no answer.
        """
        rows = await self.client.fetch("list_jobs", self.name, state, limit)
        return [job_view(r) for r in rows]

    async def stats(self) -> dict[str, int]:
        """How many of this queue's jobs are in each state (states with none
        are left out).

        Raises:
            Unavailable: the database gave no answer.
        """
        rows = await self.client.fetch("queue_stats", self.name)
        return {r["state"]: r["jobs"] for r in rows}


def job_view(row: asyncpg.Record) -> dict[str, Any]:
    out = dict(row)
    out["payload"] = json.loads(out["payload"])
    return out
