"""What an operator or a handler does to the queue besides enqueue, claim,
complete and fail: cancel jobs, snooze one from inside its handler, pause and
resume the queue. Each is one statement in leases/sql/jobs.sql, fenced like
the rest: an old holder's late answer changes nothing.

``QueueControl`` is mixed into ``leases.Queue``."""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import asyncpg

from . import fenced
from .errors import InvalidArgument
from .metrics import JOBS

if TYPE_CHECKING:
    from .client import LeaseClient
    from .queue import Job

log = logging.getLogger("fencegate.queue")

#: what a job was when a cancel found it: cancelled from one of the first
#: three; left as it was for the others (``missing``: no such job in the queue)
Found = Literal["queued", "scheduled", "claimed", "completed", "dead", "cancelled", "missing"]

#: the longest a snooze may put a job off (a year), a guard against units mixed up
MAX_SNOOZE_SECONDS = 366 * 24 * 3600.0


@dataclass(frozen=True)
class Cancel:
    """What a cancel did to one job: ``cancelled``, and what the job was
    (``was``) when the cancel found it. A claimed job's lease ended with it:
    its holder is refused from then on and its handler is cancelled."""

    id: int
    cancelled: bool
    was: Found


class Snooze(Exception):
    """Raised by a handler run by a ``Worker``: run this job again in
    ``seconds``, without spending an attempt (``Queue.snooze``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds} seconds")
        self.seconds = check_snooze(seconds)


def check_snooze(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not math.isfinite(seconds) or not 0 <= seconds <= MAX_SNOOZE_SECONDS:
        raise InvalidArgument(f"a snooze is 0 to {MAX_SNOOZE_SECONDS:.0f} seconds")
    return float(seconds)


class QueueControl:
    """Cancel, snooze, pause and resume (mixed into ``leases.Queue``)."""

    client: LeaseClient
    name: str

    async def cancel(self, job_id: int) -> Cancel:
        """Cancel one job of this queue (``cancel_many``)."""
        [done] = await self.cancel_many([job_id])
        return done

    async def cancel_many(self, job_ids: Sequence[int]) -> list[Cancel]:
        """Cancel jobs of this queue, in one statement; what became of each,
        in order. A queued or scheduled job never runs. A claimed one's lease
        ends at once: its fence is refused at the gateway and by fenced
        completion (``complete``, ``fencegate_complete_job``), its renewal is
        refused, so a ``Worker`` running it cancels its handler (the worker
        listens for cancels and checks at once) and records nothing. A
        cancelled job stays cancelled: never retried, never dead, never
        replayed. A job already finished is left as it is (``cancelled``
        False, ``was`` says what it is); a completion that committed first
        wins over the cancel, and one that comes after is refused."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise InvalidArgument("job ids are integers")
        rows = await self.client.fetch("cancel_jobs", self.name, ids)
        gone: dict[int, Found] = {r["id"]: r["was"] for r in rows}
        left = [i for i in ids if i not in gone]
        found: dict[int, Found] = {}
        if left:
            for r in await self.client.fetch("job_states", left):
                found[r["id"]] = r["state"] if r["queue"] == self.name else "missing"
        if gone:
            JOBS.labels(queue=self.name, event="cancelled").inc(len(gone))
            log.info("cancelled %d job(s) of queue %s", len(gone), self.name, extra={
                "queue": self.name, "jobs": sorted(gone)})
        by_id = {i: Cancel(i, True, gone[i]) if i in gone
                 else Cancel(i, False, found.get(i, "missing")) for i in ids}
        return [by_id[i] for i in job_ids]

    async def snooze(self, job: Job, seconds: float, *,
                     connection: asyncpg.Connection | None = None) -> bool:
        """From inside the job's run: put it off for ``seconds`` without
        spending an attempt (its claim's attempt is given back), ending its
        lease. Fenced like ``complete``: only the current holder's counts;
        False (and nothing changed) when a newer claim owns the job, its lease
        lapsed, or it was cancelled. With ``connection`` (the caller's, in its
        transaction) a stale fence raises ``FenceRefused``. A ``Worker``
        whose handler snoozed its job records nothing more for that run
        (raising ``Snooze`` from the handler does this for you)."""
        seconds = check_snooze(seconds)
        if connection is not None:
            await fenced.check_fence(connection, job.lease.resource, job.fence)
        run_at: dt.datetime | None = await self.client.fetchval(
            "snooze_job", job.id, job.fence, seconds, connection=connection)
        if run_at is None:
            return False
        job.snoozed = True
        job.lease.ended_elsewhere()
        JOBS.labels(queue=self.name, event="snoozed").inc()
        return True

    async def pause(self) -> dt.datetime:
        """Pause this queue: from the moment this returns, no claim of it
        succeeds (claims in flight have committed; later ones find it
        paused), until ``resume``. Jobs claimed before go on and finish;
        expired claims are still recovered (back to the queue, where they
        wait). Answers since when it is paused."""
        paused_at: dt.datetime = await self.client.fetchval("pause_queue", self.name)
        log.info("queue %s paused", self.name, extra={"queue": self.name})
        return paused_at

    async def resume(self) -> bool:
        """Resume this queue and wake its idle workers; whether it was paused."""
        resumed = bool(await self.client.fetchval("resume_queue", self.name))
        if resumed:
            log.info("queue %s resumed", self.name, extra={"queue": self.name})
        return resumed

    async def paused_since(self) -> dt.datetime | None:
        """Since when this queue is paused, or ``None`` while it runs."""
        row = await self.client.fetchrow("list_queues", self.name)
        return None if row is None else row["paused_at"]
