"""The end of a job's run, recorded inside its lease (``Worker``,
leases/worker.py, runs the jobs): a result checked before it is stored, the
completions of one turn in one statement (group commit, leases/batch.py), a
failure spending an attempt, a snooze giving it back, and nothing recorded
under a lease known lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from .batch import Entry, GroupCommit
from .errors import Busy
from .queue import Job, Queue, error_text
from .retry import sanitize_error

log = logging.getLogger("fencegate.worker")

#: the largest result a handler may return, in bytes of UTF-8: it is stored
#: in the job's row as ``result_ref``, a reference (a key, a URL, an id), not
#: the result itself (PostgreSQL text would take up to 1 GB, and every batch
#: of completions carries it)
MAX_RESULT_BYTES = 1024 * 1024
MAX_RESULT_LABEL = "1 MiB"
#: a statement refused for a busy pool (nothing sent) goes again after this
BUSY_RETRY_SECONDS = 0.05


def unstorable(result: object) -> str | None:
    """Why a handler's return value cannot be stored as ``result_ref``, or
    ``None`` when it can: ``None``, or a ``str`` PostgreSQL text can hold of
    at most ``MAX_RESULT_BYTES`` in UTF-8."""
    if result is None:
        return None
    if not isinstance(result, str):
        return f"the handler returned {type(result).__name__}, not str or None"
    # each character is at least one byte: a result longer than the bound in
    # characters is refused before anything is encoded (or sent)
    if len(result) > MAX_RESULT_BYTES:
        return (f"it is {len(result)} characters long, over the {MAX_RESULT_LABEL} a "
                f"result reference may take (store the result elsewhere, return its key)")
    if "\x00" in result:
        return "it contains a NUL character, which PostgreSQL text cannot hold"
    try:
        size = len(result.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid Unicode (a lone surrogate)"
    if size > MAX_RESULT_BYTES:
        return (f"it is {size} bytes of UTF-8, over the {MAX_RESULT_LABEL} a result "
                f"reference may take (store the result elsewhere, return its key)")
    return None


def still_ours(job: Job) -> None:
    """Raise the lease's ``LeaseLost`` if it is lost: whatever the run ended
    with, nothing is recorded under a fence that is no longer ours (not a
    result, not a failure that would spend an attempt)."""
    lost = job.lease.lost
    if lost is not None:
        raise lost


class Completions(GroupCommit[tuple[Job, str | None], bool]):
    """Completions that happen in the same turn of the event loop go to the
    database as one statement: a batch of claimed jobs that finish together
    costs one round trip, not one each. Nothing waits for a timer, and
    nothing waits for another statement to come back.

    An entry is dropped, not written, when its lease is known lost by the
    time it would be sent (lease rule 6: nothing is "finished up" in
    lost-ownership mode; its future gets the ``LeaseLost``), or when its
    future was cancelled (the job's run was cancelled: its lease was lost,
    or shutdown ended it). A result the database refuses to store fails the
    statement for all: each entry goes again alone, so the bad one costs
    only itself; so does a batch PostgreSQL aborts as a deadlock."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(max_in_flight=None)
        self.queue = queue

    def complete(self, job: Job, result: str | None) -> asyncio.Future[bool]:
        """Queue ``job``'s completion; the future answers whether it counted."""
        return self.submit((job, result))

    def _keep(self, entry: Entry[tuple[Job, str | None], bool]) -> bool:
        # ``lost`` looks at the clock: a deadline passed in a pause is seen
        # here, before the loop has run the alarm's callback
        lost = entry.item[0].lease.lost
        if lost is not None and not entry.future.done():
            entry.future.set_exception(lost)
        return not entry.future.done()

    async def _send(self, batch: list[Entry[tuple[Job, str | None], bool]]) -> None:
        batch = [entry for entry in batch if self._keep(entry)]  # again, as it leaves
        if not batch:
            return
        try:
            counted = await self.queue.complete_many([entry.item for entry in batch])
        except (asyncpg.DataError, asyncpg.DeadlockDetectedError) as exc:
            # a deadlock too: another transaction completing several of these
            # jobs in its own order (the caller's, by id descending) can take
            # a lease row this batch waits for; alone, each takes one job's
            # rows, and none waits for an entry of its own batch again
            if not self.one_by_one(batch):
                _settle(batch[0].future, exc)
            return
        except asyncio.CancelledError:  # shutdown past its grace: nobody waits any more
            for entry in batch:
                entry.future.cancel()
            raise
        except Exception as exc:
            for entry in batch:
                _settle(entry.future, exc)
            return
        for entry in batch:
            job = entry.item[0]
            if not entry.future.done():
                entry.future.set_result(job.id in counted)
            elif job.id in counted:  # sent before its run was cancelled
                log.info("job %s of queue %s: its completion, sent before its run was "
                         "cancelled, counted", job.id, job.queue, extra={
                             "queue": job.queue, "job": job.id, "fence": job.fence})


def _settle(fut: asyncio.Future[bool], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class Recorder:
    """Records how each run of a job ended, inside its lease: a completion
    (batched with those of the same turn) or a failure. A statement that got
    no pooled connection in time (``Busy``: nothing was sent) goes again
    after ``BUSY_RETRY_SECONDS``, while the lease is still ours."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.completions = Completions(queue)

    async def _busy(self, job: Job, what: str) -> None:
        """A statement recording ``what`` got no pooled connection in time:
        nothing was sent, and the lease is still held (renewals have
        connections of their own). It goes again, after a breath, rather than
        the job running twice; unless the lease is lost meanwhile."""
        still_ours(job)
        log.info("job %s of queue %s: no database connection came free for its %s; "
                 "sending it again", job.id, job.queue, what, extra={
                     "queue": job.queue, "job": job.id, "fence": job.fence, "error": "Busy"})
        await asyncio.sleep(BUSY_RETRY_SECONDS)
        still_ours(job)

    async def failure(self, job: Job, error: BaseException | str) -> None:
        """Record a failed attempt of ``job`` (retried later, or dead)."""
        while True:
            try:
                state = await self.queue.fail(job, error)
            except Busy:
                await self._busy(job, "failure")
            else:
                break
        log.warning(
            "job %s of queue %s failed (attempt %d of %d), %s: %s",
            job.id, job.queue, job.attempts, job.max_attempts,
            {"queued": "retried later", "dead": "dead now"}.get(
                state or "", "not counted (stale fence)"),
            error_text(error), extra={
                "queue": job.queue, "job": job.id, "fence": job.fence,
                "owner": job.lease.owner, "attempt": job.attempts, "now": state})

    async def snooze(self, job: Job, seconds: float) -> None:
        """The handler raised ``Snooze``: put the job off without spending an
        attempt (refused under a lapsed or newer fence, or after a cancel)."""
        while True:
            try:
                snoozed = await self.queue.snooze(job, seconds)
            except Busy:
                await self._busy(job, "snooze")
            else:
                break
        if snoozed:
            log.info("job %s of queue %s snoozed for %.3g s", job.id, job.queue, seconds,
                     extra={"queue": job.queue, "job": job.id, "fence": job.fence})
        else:
            log.warning("job %s of queue %s: its snooze under fence %s did not count (a "
                        "newer claim, a lapsed lease, or a cancel)", job.id, job.queue,
                        job.fence, extra={"queue": job.queue, "job": job.id,
                                          "fence": job.fence})

    async def end(self, job: Job, result: object, handled: Callable[[], None]) -> None:
        """Complete the job with its result; a result that cannot be stored
        fails the job instead, with that reason. ``handled`` is called once
        the completion is queued (or the failure is about to be recorded):
        the job's slot may take the next one meanwhile."""
        why = unstorable(result)
        if why is None:
            why = await self._complete(job, result, handled)  # type: ignore[arg-type]
            if why is None:
                return
        handled()
        await self.failure(job, f"its result could not be stored: {why}")

    async def _complete(self, job: Job, result: str | None,
                        handled: Callable[[], None]) -> str | None:
        """Record the job's completion; ``None``, or why the database refused
        to store its result."""
        completed = self.completions.complete(job, result)
        handled()
        while True:
            try:
                counted = await completed
            except Busy:
                await self._busy(job, "completion")
                completed = self.completions.complete(job, result)
                continue
            except asyncpg.DataError as exc:  # refused by the database itself
                still_ours(job)
                return sanitize_error(str(exc))
            if not counted:
                log.warning("job %s of queue %s completed under fence %s, no longer "
                            "current: not counted", job.id, job.queue, job.fence,
                            extra={"queue": job.queue, "job": job.id,
                                   "fence": job.fence, "owner": job.lease.owner})
            return None

    async def close(self, timeout: float) -> None:
        """Send the completions queued, wait up to ``timeout`` for those out,
        then cancel what is still waiting: nothing is left running."""
        await self.completions.close(timeout)
