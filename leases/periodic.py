"""Periodic jobs: cron schedules whose ticks are enqueued exactly once.

A ``Schedule`` names a cron expression and the job each tick enqueues. A
``Scheduler`` (any number of them, in any number of processes) enqueues each
tick with the dedupe key ``periodic:<name>:<tick>``, through the queue's
ordinary idempotent enqueue: however many schedulers see a tick, one job
exists for it and the others are answered "duplicate".

The rule for missed ticks (the schedulers were all down): only the latest
tick at or before now is enqueued, once, and only if it is at most
``catch_up`` seconds old (default and cap: the queue's retention). Older
ticks are never enqueued. The cap is what keeps "exactly once" true after a
purge: a tick's job, finished, keeps its dedupe key at least for the
retention, so a tick no older than that cannot have lost its job's row.
The cap is applied twice: to the clock a pass reads first, and again, in
the enqueue's transaction, to the clock read after its insert
(``drop_late_ticks``), so a pass that stalled between the two cannot make
a tick whose finished job a purge took meanwhile.

Ticks are computed on the database's clock (``clock_timestamp()``), never a
process's; ``latest_tick`` and ``next_tick`` are pure functions of a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg
from croniter import croniter

from . import enqueue as enqueuing
from .client import LeaseClient
from .errors import Busy, InvalidArgument, Unavailable
from .metrics import PERIODIC_RESULTS, PERIODIC_TICKS
from .queue import DEFAULT_RETENTION_SECONDS, NewJob, Queue, check_queue

log = logging.getLogger("fencegate.periodic")

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,100}")
KEY_PREFIX = "periodic:"
TICK_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
TICK_WIDTH = len("2026-12-02T03:00:00Z")
#: a scheduler reads the database clock again at least this often
DEFAULT_MAX_SLEEP_SECONDS = 60.0
#: after a failed pass (the database did not answer), wait this long
RETRY_SECONDS = 1.0
#: a pass's new ticks stay uncommitted until drop_late_ticks has looked, and
#: every other scheduler's pass on the queue waits for them: a pass that
#: stalls in between (a GC pause, a SIGSTOP) has its session ended and its
#: ticks rolled back after this long idle, and the others go on
IDLE_IN_TRANSACTION_SECONDS = 5.0


@dataclass(frozen=True)
class Schedule:
    """A job enqueued at every tick of ``cron`` on ``queue``.

    ``cron`` has five fields (minute hour day month weekday) or six, the sixth
    being seconds (``"*/5 * * * * *"``: every five seconds), read in
    ``timezone``. ``catch_up``: a tick older than this many seconds when a
    scheduler first sees it is skipped (None: up to the queue's retention).
    """

    name: str
    cron: str
    queue: str
    payload: Any = field(default_factory=dict)
    priority: int = 0
    max_attempts: int | None = None
    ordering_key: str | None = None
    timezone: str = "UTC"
    catch_up: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise InvalidArgument("schedule names are 1 to 100 of A-Z a-z 0-9 . _ -")
        check_queue(self.queue)
        if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
            raise InvalidArgument(f"schedule {self.name}: {self.cron!r} is not a cron "
                                  "expression (five fields, or six with seconds last)")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidArgument(f"schedule {self.name}: no time zone {self.timezone!r}"
                                  ) from None
        if self.catch_up is not None and self.catch_up < 0:
            raise InvalidArgument(f"schedule {self.name}: catch_up must not be negative")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidArgument(f"schedule {self.name}: max_attempts must be at least 1")


def _local(schedule: Schedule, at: dt.datetime) -> dt.datetime:
    if at.tzinfo is None:
        raise InvalidArgument("a time without a time zone")
    return at.astimezone(ZoneInfo(schedule.timezone)).replace(microsecond=0)


def latest_tick(schedule: Schedule, now: dt.datetime) -> dt.datetime:
    """The schedule's latest tick at or before ``now`` (UTC)."""
    # croniter's get_prev is strictly before its start: start one second after
    # now, truncated (ticks fall on whole seconds)
    start = _local(schedule, now) + dt.timedelta(seconds=1)
    tick: dt.datetime = croniter(schedule.cron, start).get_prev(dt.datetime)
    tick = tick.astimezone(dt.UTC)
    # Across a daylight saving change get_prev can answer an earlier tick
    # than the latest (it reads a repeated local hour as its first instance)
    # while get_next counts both: make the answer agree with next_tick. Gallop
    # back from now to the first window that holds a tick, then step forward.
    if next_tick(schedule, tick) <= now:
        back = dt.timedelta(seconds=1)
        while now - back > tick and next_tick(schedule, now - back) > now:
            back *= 2
        if now - back > tick:
            tick = next_tick(schedule, now - back)
        while (following := next_tick(schedule, tick)) <= now:
            tick = following
    return tick


def next_tick(schedule: Schedule, now: dt.datetime) -> dt.datetime:
    """The schedule's first tick after ``now`` (UTC)."""
    tick: dt.datetime = croniter(schedule.cron, _local(schedule, now)).get_next(dt.datetime)
    return tick.astimezone(dt.UTC)


def due_tick(schedule: Schedule, now: dt.datetime,
             retention_seconds: float = DEFAULT_RETENTION_SECONDS) -> dt.datetime | None:
    """The tick to enqueue at ``now``: the latest one, unless it is older than
    the schedule's ``catch_up`` (or the retention, whichever is less)."""
    tick = latest_tick(schedule, now)
    limit = retention_seconds if schedule.catch_up is None \
        else min(schedule.catch_up, retention_seconds)
    return tick if (now - tick).total_seconds() <= limit else None


def tick_key(name: str, tick: dt.datetime) -> str:
    """``periodic:<name>:<tick>``, the tick in UTC to the second:
    ``periodic:daily-backstop:2026-12-02T03:00:00Z``."""
    return f"{KEY_PREFIX}{name}:{tick.astimezone(dt.UTC).strftime(TICK_FORMAT)}"


def tick_of(dedupe_key: str | None) -> tuple[str, dt.datetime] | None:
    """``(schedule name, tick)`` of a periodic job's dedupe key (``job.dedupe_key``);
    None for any other job."""
    if not dedupe_key or not dedupe_key.startswith(KEY_PREFIX):
        return None
    rest = dedupe_key[len(KEY_PREFIX):]
    # the time has a fixed width: YYYY-MM-DDTHH:MM:SSZ, after the name and a colon
    name, sep, at = rest[:-TICK_WIDTH - 1], rest[-TICK_WIDTH - 1:-TICK_WIDTH], rest[-TICK_WIDTH:]
    if sep != ":" or not NAME_PATTERN.fullmatch(name):
        return None
    try:
        tick = dt.datetime.strptime(at, TICK_FORMAT)
    except ValueError:
        return None
    return name, tick.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Tick:
    """What one pass did with one schedule's tick."""

    schedule: str
    tick: dt.datetime
    job_id: int
    #: False: another scheduler (or an earlier pass) had enqueued it
    enqueued: bool


class Scheduler:
    """Enqueues the ticks of ``schedules`` as they fall due. Run one in every
    worker process, or one per host: a tick becomes one job however many run.

    ``retention_seconds`` must be the retention of the workers' ``Queue``
    (the default is the same), so no missed tick older than what purge keeps
    is enqueued (module docstring). ``on_tick`` is called with what became of
    each due tick, enqueued here or found there already.
    """

    def __init__(self, client: LeaseClient, schedules: Sequence[Schedule], *,
                 retention_seconds: float = DEFAULT_RETENTION_SECONDS,
                 max_sleep: float = DEFAULT_MAX_SLEEP_SECONDS,
                 on_tick: Callable[[Tick], None] | None = None) -> None:
        names = [s.name for s in schedules]
        if len(set(names)) != len(names):
            raise InvalidArgument("two schedules share a name")
        if max_sleep <= 0:
            raise InvalidArgument("max_sleep must be positive")
        self.client = client
        self.schedules = tuple(schedules)
        self.retention_seconds = retention_seconds
        self.max_sleep = max_sleep
        self._queues = {s.queue: Queue(client, s.queue, retention_seconds=retention_seconds)
                        for s in schedules}
        for s in schedules:  # every series from the start, at 0 (metrics.start_at_zero)
            for result in PERIODIC_RESULTS:
                PERIODIC_TICKS.labels(schedule=s.name, result=result)
        self._skipped: dict[str, dt.datetime] = {}
        self._stopping = asyncio.Event()
        #: set after every pass, failed ones too (a test hook)
        self.passed = asyncio.Event()
        self.on_tick = on_tick

    async def database_now(self) -> dt.datetime:
        """The database's clock."""
        now: dt.datetime = await self.client.fetchval("database_now")
        return now

    async def run_once(self, now: dt.datetime | None = None) -> list[Tick]:
        """Enqueue every due tick not enqueued yet (``now``: the database's
        clock unless given); what became of each."""
        now = now if now is not None else await self.database_now()
        by_queue: dict[str, list[tuple[Schedule, dt.datetime]]] = {}
        for s in self.schedules:
            tick = due_tick(s, now, self.retention_seconds)
            if tick is None:
                self._too_late(s, latest_tick(s, now))
                continue
            by_queue.setdefault(s.queue, []).append((s, tick))
        done: list[Tick] = []
        for queue, due in by_queue.items():
            async with self.client.transaction() as conn:
                await self.client.fetchval(
                    "bound_idle_transaction", str(round(IDLE_IN_TRANSACTION_SECONDS * 1000)),
                    connection=conn)
                answers = await self._queues[queue].enqueue_reporting([NewJob(
                    s.payload, dedupe_key=tick_key(s.name, tick), ordering_key=s.ordering_key,
                    max_attempts=s.max_attempts, priority=s.priority) for s, tick in due],
                    connection=conn, count=False)
                made = [(a.id, tick) for (_, tick), a in zip(due, answers, strict=True)
                        if not a.deduplicated]
                late = {r["id"] for r in await self.client.fetch(
                    "drop_late_ticks", [i for i, _ in made], [t for _, t in made],
                    self.retention_seconds, connection=conn)} if made else set()
            enqueuing.counted(queue, [a for a in answers if a.id not in late])
            for (s, tick), answer in zip(due, answers, strict=True):
                if answer.id in late:  # this pass read the clock before a stall (drop_late_ticks)
                    self._too_late(s, tick)
                    continue
                done.append(Tick(s.name, tick, answer.id, not answer.deduplicated))
                PERIODIC_TICKS.labels(schedule=s.name, result="duplicate"
                                      if answer.deduplicated else "enqueued").inc()
                if self.on_tick is not None:
                    self.on_tick(done[-1])
                if not answer.deduplicated:
                    log.info("schedule %s: tick %s enqueued as job %s", s.name,
                             tick_key(s.name, tick), answer.id, extra={
                                 "schedule": s.name, "queue": queue, "job": answer.id})
        return done

    def _too_late(self, s: Schedule, tick: dt.datetime) -> None:
        """A tick older than its catch_up or the retention: skipped, counted
        once per tick."""
        if self._skipped.get(s.name) != tick:
            self._skipped[s.name] = tick
            PERIODIC_TICKS.labels(schedule=s.name, result="too_late").inc()
            log.info("schedule %s: tick %s skipped, older than its catch_up or the retention",
                     s.name, tick_key(s.name, tick), extra={"schedule": s.name})

    def stop(self) -> None:
        """End ``run()`` (a pass under way finishes first)."""
        self._stopping.set()

    async def run(self) -> None:
        """Pass at every tick until ``stop()``. An unanswered pass is logged
        and tried again: the ticks it missed are due still (the latest one)."""
        while not self._stopping.is_set():
            try:
                await self.run_once()
                now = await self.database_now()
                wait = min([(next_tick(s, now) - now).total_seconds()
                            for s in self.schedules] or [self.max_sleep])
            except (Unavailable, Busy, asyncpg.PostgresError) as exc:
                log.warning("periodic pass failed: %s", exc, extra={"error": type(exc).__name__})
                wait = RETRY_SECONDS
            self.passed.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(),
                                       max(0.0, min(wait, self.max_sleep)))
