"""Periodic jobs on a real PostgreSQL: one job per tick however many
schedulers, in however many processes, see it."""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from leases import LeaseClient, Queue, Unavailable, Worker, database, periodic
from leases.periodic import Schedule, Scheduler, tick_key, tick_of
from leases.queue import Job
from tests.support.served import FENCEGATE
from tests.support.waiting import until

PROCESSES = 4
TICKS = 25
DAILY = Schedule("daily-backstop", "0 3 * * *", queue="backstop", payload={"sweep": "all"})
EVERY_SECOND = Schedule("heartbeat", "* * * * * *", queue="beats")


def counted(schedule: str, result: str) -> float:
    """This process's fencegate_periodic_ticks_total for one schedule and result."""
    return REGISTRY.get_sample_value("fencegate_periodic_ticks_total",
                                     {"schedule": schedule, "result": result}) or 0.0


def _instants() -> list[dt.datetime]:
    """Moments just after each of TICKS daily ticks (the clock is injected,
    so nobody waits for 03:00)."""
    first = dt.datetime(2026, 1, 1, 3, 0, 0, 400_000, tzinfo=dt.UTC)
    return [first + dt.timedelta(days=n) for n in range(TICKS)]


def _race_ticks(dsn: str, ready: Any, results: Any) -> None:
    async def main() -> None:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        scheduler = Scheduler(LeaseClient(pool=pool), [DAILY],
                              retention_seconds=10 * 365 * 86400.0)
        ready.wait()  # every process connected: all take on the same tick at once
        enqueued = 0
        for now in _instants():
            enqueued += sum(t.enqueued for t in await scheduler.run_once(now))
        results.put(enqueued)
        await pool.close()

    asyncio.run(main())


async def test_processes_racing_the_same_ticks_enqueue_one_job_per_tick(
        dsn: str, pool: asyncpg.Pool) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_race_ticks, args=(dsn, ready, results))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        await asyncio.to_thread(p.join, 120)
        assert p.exitcode == 0
    claimed = [results.get(timeout=5) for _ in procs]
    rows = await pool.fetch("SELECT dedupe_key, payload FROM fencegate_jobs "
                            "WHERE queue = 'backstop' ORDER BY dedupe_key")
    assert [r["dedupe_key"] for r in rows] == [tick_key(DAILY.name, dt.datetime(
        2026, 1, 1, 3, tzinfo=dt.UTC) + dt.timedelta(days=n)) for n in range(TICKS)]
    assert sum(claimed) == TICKS, f"schedulers each said they enqueued: {claimed}"


def _run_scheduler(dsn: str, stop: Any, results: Any) -> None:
    async def main() -> None:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        scheduler = Scheduler(LeaseClient(pool=pool), [EVERY_SECOND])
        running = asyncio.create_task(scheduler.run())
        await asyncio.to_thread(stop.wait)
        scheduler.stop()
        await running
        results.put(counted(EVERY_SECOND.name, "enqueued"))
        await pool.close()

    asyncio.run(main())


async def test_schedulers_running_in_several_processes_make_each_tick_once(
        dsn: str, pool: asyncpg.Pool) -> None:
    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_run_scheduler, args=(dsn, stop, results)) for _ in range(3)]
    for p in procs:
        p.start()

    await until(lambda: ticks_seen(pool, 4), "four ticks of a per-second schedule")
    stop.set()
    for p in procs:
        await asyncio.to_thread(p.join, 60)
        assert p.exitcode == 0
    enqueued = [results.get(timeout=5) for _ in procs]
    keys = [r["dedupe_key"] for r in await pool.fetch(
        "SELECT dedupe_key FROM fencegate_jobs WHERE queue = 'beats'")]
    found = [tick_of(k) for k in keys]
    assert all(f is not None and f[0] == "heartbeat" for f in found), keys
    assert len(set(found)) == len(keys)
    assert sum(enqueued) == len(keys), "two schedulers each believed they made one tick"


async def ticks_seen(pool: asyncpg.Pool, n: int) -> bool:
    return bool(await pool.fetchval(
        "SELECT count(*) >= $1 FROM fencegate_jobs WHERE queue = 'beats'", n))


async def test_after_downtime_only_the_latest_missed_tick_is_enqueued(
        pool: asyncpg.Pool) -> None:
    minutely = Schedule("minutely", "* * * * *", queue="report")
    scheduler = Scheduler(LeaseClient(pool=pool), [minutely])
    # within the retention of the database's clock, which the enqueue checks again
    first = (await scheduler.database_now()).replace(second=0, microsecond=0) - \
        dt.timedelta(hours=1)
    await scheduler.run_once(first + dt.timedelta(seconds=5))
    [tick] = await scheduler.run_once(first + dt.timedelta(minutes=10, seconds=5))  # down 10 min
    assert tick.enqueued and tick.tick == first + dt.timedelta(minutes=10)
    keys = [r["dedupe_key"] for r in await pool.fetch(
        "SELECT dedupe_key FROM fencegate_jobs ORDER BY id")]
    assert keys == [tick_key("minutely", first),
                    tick_key("minutely", first + dt.timedelta(minutes=10))]


async def test_a_tick_past_its_catch_up_is_skipped_and_counted(pool: asyncpg.Pool) -> None:
    strict = Schedule("strict", "0 3 * * *", queue="q", catch_up=60)
    scheduler = Scheduler(LeaseClient(pool=pool), [strict])
    was = counted("strict", "too_late")
    late = dt.datetime(2026, 12, 2, 3, 5, tzinfo=dt.UTC)
    assert await scheduler.run_once(late) == []
    assert await scheduler.run_once(late + dt.timedelta(seconds=30)) == []
    assert counted("strict", "too_late") == was + 1, "one skip per tick, however many passes"
    assert await pool.fetchval("SELECT count(*) FROM fencegate_jobs") == 0


async def test_a_scheduler_that_stalled_past_the_retention_does_not_enqueue_a_tick_again(
        pool: asyncpg.Pool) -> None:
    """A tick's job, finished, keeps its dedupe key for the queue's retention;
    then the purge deletes it. A scheduler that read the database's clock
    while the tick was within the retention, then stalled (a GC pause, a
    SIGSTOP) while the purge deleted the tick's finished job, must not make
    the tick a second job when it wakes: the enqueue's own transaction reads
    the database's clock again after the insert and takes back a tick older
    than the retention by then. Its pass counts it as too late."""
    minutely = Schedule("edge", "* * * * *", queue="edge")
    retention = 90.0
    client = LeaseClient(pool=pool)
    scheduler = Scheduler(client, [minutely], retention_seconds=retention)
    db_now = await scheduler.database_now()
    tick = db_now.replace(second=0, microsecond=0) - dt.timedelta(minutes=2)  # 120-180 s old
    read_then = tick + dt.timedelta(seconds=30)  # the clock the scheduler read, 30 s in
    # the tick's job, enqueued in its time (the retention then still ahead of it)
    [first] = await Scheduler(client, [minutely], retention_seconds=3600.0).run_once(read_then)
    assert first.enqueued and first.tick == tick
    # the tick's job ran and finished a second after its tick, then the purge came
    await pool.execute("UPDATE fencegate_jobs SET state = 'completed', finished_at = $2 "
                       "WHERE id = $1", first.job_id, tick + dt.timedelta(seconds=1))
    assert await Queue(client, "edge", retention_seconds=retention).purge() == 1
    was, made = counted("edge", "too_late"), _jobs_counted("edge", "enqueued")
    assert await scheduler.run_once(read_then) == []  # it wakes with the clock it read
    assert await pool.fetchval("SELECT count(*) FROM fencegate_jobs WHERE queue = 'edge'") == 0
    assert counted("edge", "too_late") == was + 1
    assert _jobs_counted("edge", "enqueued") == made, "a tick taken back was counted as a job"


def _jobs_counted(queue: str, event: str) -> float:
    return REGISTRY.get_sample_value("fencegate_jobs_total",
                                     {"queue": queue, "event": event}) or 0.0


async def test_a_stalled_scheduler_waits_for_a_purge_in_progress_then_takes_the_tick_back(
        pool: asyncpg.Pool) -> None:
    """The purge's delete of the tick's finished job is not committed yet
    when the stalled scheduler inserts the tick: the insert's ON CONFLICT
    waits for that transaction, and once it commits, the insert goes in and
    the recheck after it, on the database's clock, takes it back."""
    minutely = Schedule("edge-wait", "* * * * *", queue="edge-wait")
    retention = 90.0
    client = LeaseClient(pool=pool)
    scheduler = Scheduler(client, [minutely], retention_seconds=retention)
    db_now = await scheduler.database_now()
    tick = db_now.replace(second=0, microsecond=0) - dt.timedelta(minutes=2)
    read_then = tick + dt.timedelta(seconds=30)
    [first] = await Scheduler(client, [minutely], retention_seconds=3600.0).run_once(read_then)
    await pool.execute("UPDATE fencegate_jobs SET state = 'completed', finished_at = $2 "
                       "WHERE id = $1", first.job_id, tick + dt.timedelta(seconds=1))
    async with pool.acquire() as purger:
        purge = purger.transaction()
        await purge.start()
        assert await purger.fetchval(
            "WITH d AS (DELETE FROM fencegate_jobs WHERE id = $1 RETURNING 1) "
            "SELECT count(*) FROM d", first.job_id) == 1
        woke = asyncio.create_task(scheduler.run_once(read_then))
        await until(lambda: _waits_for_a_lock(pool), "the tick's insert to wait for the purge")
        assert not woke.done()
        await purge.commit()
        assert await woke == []
    assert await pool.fetchval(
        "SELECT count(*) FROM fencegate_jobs WHERE queue = 'edge-wait'") == 0


async def _waits_for_a_lock(pool: asyncpg.Pool) -> bool:
    return bool(await pool.fetchval(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' "
        "AND query LIKE '%INSERT INTO fencegate_jobs%'"))


class _StallsBeforeItsRecheck(LeaseClient):
    """A scheduler's client that stalls, its new tick inserted and not yet
    committed, until ``resume`` is set (a GC pause, a SIGSTOP)."""

    def __init__(self, pool: asyncpg.Pool, resume: asyncio.Event) -> None:
        super().__init__(pool=pool)
        self.resume = resume
        #: set once its tick is inserted, the transaction open, and it stalls
        self.stalled = asyncio.Event()

    async def fetch(self, name: str, *args: Any, **kw: Any) -> list[asyncpg.Record]:
        if name == "drop_late_ticks":
            self.stalled.set()
            await self.resume.wait()
        return await super().fetch(name, *args, **kw)


async def test_a_pass_stalled_in_its_transaction_holds_the_other_schedulers_back_a_while(
        pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass's new tick stays uncommitted until its recheck, and another
    scheduler's insert of the same tick waits for it. A pass that stalls
    there has its session ended once idle for IDLE_IN_TRANSACTION_SECONDS,
    its tick rolled back, so the other scheduler's pass goes on and makes
    the tick, once; the stalled pass, when it wakes, fails and makes nothing."""
    monkeypatch.setattr(periodic, "IDLE_IN_TRANSACTION_SECONDS", 0.5)
    minutely = Schedule("held", "* * * * *", queue="held")
    resume = asyncio.Event()
    client = _StallsBeforeItsRecheck(pool, resume)
    stalled = Scheduler(client, [minutely])
    now = await stalled.database_now()
    stuck = asyncio.create_task(stalled.run_once(now))
    await asyncio.wait_for(client.stalled.wait(), 60)  # its tick inserted, not committed
    try:  # (without the bound it would wait for the stalled pass, here forever)
        [tick] = await asyncio.wait_for(
            Scheduler(LeaseClient(pool=pool), [minutely]).run_once(now), 60)
    finally:
        resume.set()
    assert tick.enqueued
    with pytest.raises((Unavailable, asyncpg.PostgresError, asyncpg.InterfaceError)):
        await stuck
    assert await pool.fetchval(
        "SELECT count(*) FROM fencegate_jobs WHERE queue = 'held'") == 1


async def test_a_tick_within_the_retention_is_enqueued_by_a_scheduler_that_stalled(
        pool: asyncpg.Pool) -> None:
    """The recheck after the insert takes back only ticks older than the
    retention by the database's clock: one stalled for less is enqueued."""
    minutely = Schedule("edge-ok", "* * * * *", queue="edge-ok")
    scheduler = Scheduler(LeaseClient(pool=pool), [minutely], retention_seconds=3600.0)
    db_now = await scheduler.database_now()
    tick = db_now.replace(second=0, microsecond=0) - dt.timedelta(minutes=2)
    [made] = await scheduler.run_once(tick + dt.timedelta(seconds=30))
    assert made.enqueued and made.tick == tick
    assert await pool.fetchval(
        "SELECT count(*) FROM fencegate_jobs WHERE queue = 'edge-ok'") == 1


async def test_a_worker_runs_the_tick_s_job_and_knows_its_tick(pool: asyncpg.Pool) -> None:
    client = LeaseClient(pool=pool)
    scheduler = Scheduler(client, [DAILY])
    now = await scheduler.database_now()
    [tick] = await scheduler.run_once()
    ran: list[tuple[str, dt.datetime] | None] = []

    async def handle(job: Job) -> None:
        ran.append(tick_of(job.dedupe_key))

    worker = Worker(Queue(client, "backstop"), handle, poll_min=0.01)
    running = asyncio.create_task(worker.run())
    await until(lambda: bool(ran), "the periodic job to run")
    worker.stop()
    await running
    assert ran == [("daily-backstop", tick.tick)]
    assert tick.tick <= now


async def test_the_periodic_command_enqueues_the_file_s_ticks_until_sigterm(
        dsn: str, pool: asyncpg.Pool, tmp_path: Path) -> None:
    config = tmp_path / "schedules.toml"
    config.write_text('[[schedules]]\nname = "beat"\ncron = "* * * * * *"\nqueue = "beats"\n')
    env = {**os.environ, database.DATABASE_URL_ENV: dsn}
    proc = subprocess.Popen([*FENCEGATE, "jobs", "periodic", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        await until(lambda: ticks_seen(pool, 2), "two ticks enqueued by the command")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, err
    keys = {r["dedupe_key"] for r in await pool.fetch(
        "SELECT dedupe_key FROM fencegate_jobs WHERE queue = 'beats'")}
    said = set(re.findall(r"enqueued (periodic:beat:\S+) as job \d+", out))
    assert len(said) >= 2 and said <= keys


def test_a_bad_schedules_file_is_a_clear_message(dsn: str, tmp_path: Path) -> None:
    config = tmp_path / "schedules.toml"
    config.write_text('[[schedules]]\nname = "beat"\ncron = "every second"\nqueue = "q"\n')
    env = {**os.environ, database.DATABASE_URL_ENV: dsn}
    done = subprocess.run([*FENCEGATE, "jobs", "periodic", str(config)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "schedule 1: schedule beat: 'every second' is not a cron expression" in done.stderr
    assert "Traceback" not in done.stderr
