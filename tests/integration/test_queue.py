"""The work queue on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import itertools
import random
import re

import asyncpg
import pytest

from leases import LeaseClient, NewJob, Queue, RetryPolicy, Worker, clock, sql
from leases.batch import MAX_BATCH
from leases.completion import MAX_RESULT_BYTES, unstorable
from leases.queue import Job
from tests.support.lapse import lapse
from tests.support.waiting import GENEROUS_SECONDS, until


def queue(pool: asyncpg.Pool, name: str = "mail", owner: str = "w1", **kw: object) -> Queue:
    return Queue(LeaseClient(pool=pool, owner=owner), name, rng=random.Random(1),
                 **kw)  # type: ignore[arg-type]


async def test_enqueue_is_idempotent_on_the_dedupe_key(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    first = await q.enqueue({"to": "a"}, dedupe_key="welcome:a")
    again = await q.enqueue({"to": "changed"}, dedupe_key="welcome:a")
    other = await q.enqueue({"to": "b"}, dedupe_key="welcome:b")
    assert first == again != other
    assert (await q.stats()) == {"queued": 2}
    # another queue has its own keys
    assert await queue(pool, "other").enqueue({}, dedupe_key="welcome:a") != first


async def test_concurrent_enqueues_of_one_key_make_one_job(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    for round_ in range(20):
        ids = await asyncio.gather(*(q.enqueue({"n": i}, dedupe_key=f"k{round_}")
                                     for i in range(12)))
        assert len(set(ids)) == 1
    assert (await q.stats()) == {"queued": 20}


async def test_batch_enqueue_answers_ids_in_order(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    existing = await q.enqueue({}, dedupe_key="d2")
    ids = await q.enqueue_many([NewJob({"n": 1}), NewJob({"n": 2}, dedupe_key="d2"),
                                NewJob({"n": 3}, dedupe_key="d3"), NewJob({"n": 4})])
    assert ids[1] == existing and len(set(ids)) == 4
    jobs = await q.claim(limit=10)
    assert sorted(j.payload.get("n", 0) for j in jobs) == [0, 1, 3, 4]


async def test_a_claimed_job_is_a_fenced_lease(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    job_id = await q.enqueue({"x": 1})
    [job] = await q.claim(limit=5, ttl=30)
    assert job.id == job_id and job.attempts == 1 and job.resource == f"job:mail:{job_id}"
    info = await LeaseClient(pool=pool).show(job.resource)
    assert info is not None and info.live and info.fence == job.fence and info.owner == "w1"
    assert await q.claim() == []  # nothing else runnable
    assert await q.complete(job, "msg-123") is True
    info = await LeaseClient(pool=pool).show(job.resource)
    assert info is not None and not info.live
    [row] = await q.list()
    assert row["state"] == "completed" and row["result_ref"] == "msg-123"


async def test_priority_and_run_at_are_respected(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    await q.enqueue({"n": "low"})
    await q.enqueue({"n": "high"}, priority=10)
    await q.enqueue({"n": "future"}, run_at=later, priority=100)
    jobs = await q.claim(limit=10)
    assert [j.payload["n"] for j in jobs] == ["high", "low"]
    assert (await q.stats()) == {"claimed": 2, "scheduled": 1}


async def test_a_stale_complete_after_takeover_changes_nothing(pool: asyncpg.Pool) -> None:
    q1, q2 = queue(pool, owner="w1"), queue(pool, owner="w2")
    await q1.enqueue({})
    [old] = await q1.claim(ttl=30)
    await lapse(pool, after=[q1])  # w1 stalled past its ttl
    assert await q2.recover() == 1
    [new] = await q2.claim(ttl=30)
    assert new.id == old.id and new.fence > old.fence and new.attempts == 2
    assert await q1.complete(old) is False
    assert await q1.fail(old, "late failure") is None
    [row] = await q1.list()
    assert row["state"] == "claimed" and row["claimed_by"] == "w2"
    # the old holder's fence is refused at the gateway's admission
    verdict = await pool.fetchval(
        "SELECT verdict FROM fencegate_admit_effect('c', 'k', '\\x00'::bytea, $1, $2, 'p', "
        "1, 5, 0, 0)",
        old.resource, old.fence)
    assert verdict == "stale_fence"
    assert await q2.complete(new) is True


async def fail_and_back_off(pool: asyncpg.Pool, q: Queue, job: Job, error: object,
                            low: float, high: float) -> asyncpg.Record:
    """Fail ``job``; check that it is due between ``low`` and ``high`` seconds
    after the failure by the database clock, and not claimable before; then
    move its due time to now, as if the backoff had passed."""
    before = await pool.fetchval("SELECT clock_timestamp()")
    assert await q.fail(job, error) == "queued"  # type: ignore[arg-type]
    after = await pool.fetchval("SELECT clock_timestamp()")
    row = await pool.fetchrow("SELECT run_at, last_error FROM fencegate_jobs WHERE id = $1",
                              job.id)
    assert before + dt.timedelta(seconds=low) <= row["run_at"] \
        <= after + dt.timedelta(seconds=high)
    assert await q.claim() == []  # not due yet
    await pool.execute("UPDATE fencegate_jobs SET run_at = clock_timestamp() WHERE id = $1",
                       job.id)
    return row


async def test_failures_back_off_by_the_database_clock_then_die(pool: asyncpg.Pool) -> None:
    # backoffs of a minute or more: "not due yet" holds on any machine, and
    # the test moves the due time instead of waiting it out
    q = queue(pool, retry=RetryPolicy(max_attempts=3, base_seconds=60, cap_seconds=600))
    job_id = await q.enqueue({"n": 1})
    [job] = await q.claim()
    row = await fail_and_back_off(pool, q, job, RuntimeError("smtp 451 password=hunter2"),
                                  30, 60)
    assert "hunter2" not in row["last_error"] and "RuntimeError" in row["last_error"]
    [job] = await q.claim()
    assert job.attempts == 2
    await fail_and_back_off(pool, q, job, "again", 60, 120)
    [job] = await q.claim()
    assert job.attempts == 3
    assert await q.fail(job, "for the last time") == "dead"
    [dead] = await q.list("dead")
    assert dead["id"] == job_id and dead["payload"] == {"n": 1}
    assert dead["last_error"] == "for the last time"
    assert await q.replay() == 1
    [job] = await q.claim()
    assert job.attempts == 1


async def test_bulk_replay_reports_progress(pool: asyncpg.Pool) -> None:
    q = queue(pool, retry=RetryPolicy(max_attempts=1))
    await q.enqueue_many([NewJob({"n": i}) for i in range(25)])
    for job in await q.claim(limit=25):
        await q.fail(job, "boom")
    seen: list[int] = []
    assert await q.replay(batch=10, progress=seen.append) == 25
    assert seen == [10, 20, 25]
    assert (await q.stats()) == {"queued": 25}


async def test_expired_claims_come_back_with_a_higher_fence_or_die(pool: asyncpg.Pool) -> None:
    q = queue(pool, retry=RetryPolicy(max_attempts=2))
    await q.enqueue({})
    [first] = await q.claim(ttl=30)
    await lapse(pool, after=[q])
    assert await q.recover() == 1
    [second] = await q.claim(ttl=30)
    assert second.fence > first.fence
    await lapse(pool, after=[q])
    assert await q.recover() == 1
    [row] = await q.list()
    assert row["state"] == "dead" and "lease expired" in row["last_error"]


async def test_claimers_recover_on_their_polling_path(pool: asyncpg.Pool) -> None:
    q = queue(pool, recovery_interval=0.0)
    await q.enqueue({})
    [first] = await q.claim(ttl=30)
    await lapse(pool, after=[q])
    # no explicit recover(): polling alone brings the job back
    jobs: list[Job] = []

    async def claimed() -> bool:
        jobs.extend(await q.claim())
        return bool(jobs)

    await until(claimed, "a poll claimed the expired job again")
    assert jobs[0].fence > first.fence


async def test_ordering_keys_run_one_at_a_time_in_order_and_do_not_hold_others(
    pool: asyncpg.Pool,
) -> None:
    q = queue(pool)
    await q.enqueue_many([NewJob({"key": k, "n": n}, ordering_key=k)
                          for n in range(6) for k in ("slow", "a", "b")])
    await q.enqueue_many([NewJob({"key": None, "n": n}) for n in range(6)])
    spans: dict[str | None, list[tuple[int, float, float]]] = {}
    loop = asyncio.get_running_loop()
    # the slow key's first job is held until every job of the other keys has
    # run (had they waited for it, it would wait for ever); each keyless job
    # is held until two keyless jobs have run at once
    others_done, side_by_side = asyncio.Event(), asyncio.Event()
    keyless_running = 0

    async def handler(job: Job) -> None:
        nonlocal keyless_running
        key, start = job.payload["key"], loop.time()
        if key == "slow":
            await asyncio.wait_for(others_done.wait(), GENEROUS_SECONDS)
        elif key is None:
            keyless_running += 1
            if keyless_running >= 2:
                side_by_side.set()
            try:
                await asyncio.wait_for(side_by_side.wait(), GENEROUS_SECONDS)
            finally:
                keyless_running -= 1
        await asyncio.sleep(0.01)
        spans.setdefault(key, []).append((job.payload["n"], start, loop.time()))
        if all(len(spans.get(k, ())) == 6 for k in ("a", "b")):
            others_done.set()

    worker = Worker(q, handler, concurrency=8, poll_min=0.01, poll_max=0.02)
    task = asyncio.create_task(worker.run())
    try:
        async def all_completed() -> bool:
            return (await q.stats()).get("completed") == 24

        await until(all_completed, "all 24 jobs completed", seconds=2 * GENEROUS_SECONDS)
    finally:
        worker.stop()
        await task
    assert (await q.stats()) == {"completed": 24}
    for key in ("slow", "a", "b"):
        runs = spans[key]
        assert [n for n, _, _ in runs] == list(range(6)), f"{key} ran out of order"
        for (_, _, end), (_, start, _) in itertools.pairwise(runs):
            assert start >= end, f"two jobs of key {key} overlapped"
    # the other keys did not wait for the slow one: all were done before it
    assert max(e for k in ("a", "b") for _, _, e in spans[k]) <= spans["slow"][0][2]
    assert side_by_side.is_set()  # keyless jobs ran side by side


async def test_ordering_survives_retries(pool: asyncpg.Pool) -> None:
    # a backoff of a minute: n=1 is surely not due at the check below; the
    # test then moves its due time instead of waiting it out
    q = queue(pool, retry=RetryPolicy(max_attempts=3, base_seconds=60, cap_seconds=60))
    first = await q.enqueue({"n": 1}, ordering_key="k")
    await q.enqueue({"n": 2}, ordering_key="k")
    [job] = await q.claim(limit=5)
    assert job.id == first
    assert await q.fail(job, "retry me") == "queued"
    assert await q.claim(limit=5) == []  # n=2 must not overtake the retrying n=1
    await pool.execute("UPDATE fencegate_jobs SET run_at = clock_timestamp() WHERE id = $1",
                       first)
    [job] = await q.claim(limit=5)
    assert job.id == first


@pytest.mark.parametrize("bad", [{"limit": 0}, {"ttl": -1}])
async def test_claim_arguments_are_checked(pool: asyncpg.Pool, bad: dict[str, float]) -> None:
    from leases import InvalidArgument

    with pytest.raises(InvalidArgument):
        await queue(pool).claim(**bad)  # type: ignore[arg-type]


async def test_batch_completion_counts_only_current_fences(pool: asyncpg.Pool) -> None:
    q1, q2 = queue(pool, owner="w1"), queue(pool, owner="w2")
    await q1.enqueue_many([NewJob({"n": i}) for i in range(3)])
    jobs = await q1.claim(limit=3, ttl=30)
    await lapse(pool, after=[q1])
    assert await q1.recover() == 3
    [retaken] = await q2.claim(limit=1, ttl=30)
    stale = next(j for j in jobs if j.id == retaken.id)
    fresh = [j for j in jobs if j.id != retaken.id]
    # the other two were recovered too: claim them again, complete all in one batch
    again = await q1.claim(limit=2, ttl=30)
    counted = await q1.complete_many([(stale, "x"), *((j, "ok") for j in again)])
    assert counted == {j.id for j in again} and stale.id not in counted
    assert {j.id for j in again} == {j.id for j in fresh}
    stats = await q1.stats()
    assert stats == {"claimed": 1, "completed": 2}


async def test_a_job_given_twice_counts_once_under_its_current_fence(
    pool: asyncpg.Pool,
) -> None:
    """A batch may hold a job twice (a zombie's entry under its old fence and
    the new holder's): the current fence's entry counts, once, and its
    result is the one kept, whichever comes first."""
    q1, q2 = queue(pool, owner="w1"), queue(pool, owner="w2")
    await q1.enqueue_many([NewJob({"n": i}) for i in range(2)])
    jobs = await q1.claim(limit=2, ttl=30)
    await lapse(pool, after=[q1])
    assert await q1.recover() == 2
    again = {j.id: j for j in await q2.claim(limit=2, ttl=30)}
    first, second = jobs
    entries = [(first, "stale"), (again[first.id], "current"),
               (again[second.id], "current"), (second, "stale"), (again[second.id], "current")]
    assert await q2.complete_many(entries) == {first.id, second.id}
    refs = await pool.fetch("SELECT result_ref FROM fencegate_jobs ORDER BY id")
    assert [r["result_ref"] for r in refs] == ["current", "current"]
    assert await q2.stats() == {"completed": 2}


async def test_a_completion_reads_its_arrays_whatever_their_bounds(pool: asyncpg.Pool) -> None:
    """fencegate_complete_jobs is callable from SQL: an array of one that does
    not start at 1, or has two dimensions, names its job as any other."""
    q = queue(pool)
    await q.enqueue_many([NewJob({"n": i}) for i in range(2)])
    one, two = await q.claim(limit=2, ttl=30)
    done = await pool.fetch(
        "SELECT x FROM fencegate_complete_jobs("
        "$1::text::bigint[], $2::text::bigint[], '{{kept}}') x",
        f"[0:0]={{{one.id}}}", f"{{{one.fence}}}")  # as text: bounds kept
    assert [r["x"] for r in done] == [one.id]
    done = await pool.fetch(
        "SELECT x FROM fencegate_complete_jobs($1::text::bigint[], $2::text::bigint[], NULL) x",
        f"{{{{{two.id}}}}}", f"[5:5]={{{two.fence}}}")
    assert [r["x"] for r in done] == [two.id]
    refs = await pool.fetch("SELECT result_ref FROM fencegate_jobs ORDER BY id")
    assert [r["result_ref"] for r in refs] == ["kept", None]


async def test_an_idle_worker_wakes_on_notify_not_on_its_next_poll(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    done = asyncio.Event()

    async def handler(job: Job) -> None:
        done.set()

    # polling alone would not look again for an hour
    worker = Worker(q, handler, poll_min=3600, poll_max=3600, backstop_interval=3600)
    task = asyncio.create_task(worker.run())
    # it listens (its LISTEN connection is up) before the job is enqueued
    await until(lambda: pool.fetchval(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() "
        "AND query ILIKE 'LISTEN%'"), "the worker's LISTEN")
    await q.enqueue({"n": 1})
    await asyncio.wait_for(done.wait(), GENEROUS_SECONDS)
    worker.stop()
    await task


#: set while a claim runs: a look for expired claims that the claim starts in
#: the background (the polling path) inherits it; the backstop's does not
POLLING: contextvars.ContextVar[bool] = contextvars.ContextVar("polling", default=False)


class WatchedQueue(Queue):
    """A queue that counts the claims of its polls and the looks for expired
    claims made on their path, and holds the backstop's looks until ``go``."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.polls = 0
        self.polling_recoveries = 0
        self.go = asyncio.Event()

    async def claim(self, *args: object, **kw: object) -> list[Job]:
        token = POLLING.set(True)
        try:
            jobs = await super().claim(*args, **kw)  # type: ignore[arg-type]
        finally:
            POLLING.reset(token)
        self.polls += 1
        return jobs

    async def recover(self) -> int:
        if POLLING.get():
            recovered = await super().recover()
            self.polling_recoveries += 1
            return recovered
        await self.go.wait()
        return await super().recover()


async def test_the_backstop_recovers_what_no_claimer_polls_for(pool: asyncpg.Pool) -> None:
    """Polling-path recovery off: only the Worker's backstop loop can bring an
    abandoned claim back."""
    abandoned = queue(pool, owner="dead", recovery_interval=3600)
    await abandoned.enqueue({"n": 1})
    [first] = await abandoned.claim(ttl=30)
    q = WatchedQueue(LeaseClient(pool=pool, owner="w1"), "mail", rng=random.Random(1),
                     recovery_interval=3600)
    done: list[int] = []

    async def handler(job: Job) -> None:
        done.append(job.fence)

    # the backstop looks often, but each of its looks waits for the test's go
    worker = Worker(q, handler, poll_min=0.01, poll_max=0.02, backstop_interval=0.01)
    task = asyncio.create_task(worker.run())
    try:
        # the first poll's look (the only one in an hour) has found nothing to
        # recover; then the abandoned claim lapses, and the worker polls on
        await until(lambda: q.polling_recoveries == 1, "the first poll's look")
        await lapse(pool, after=[abandoned])
        polls = q.polls
        await until(lambda: q.polls >= polls + 3, "three polls since the claim lapsed")
        assert done == [] and q.polling_recoveries == 1
        assert await pool.fetchval("SELECT claimed_by FROM fencegate_jobs") == "dead"
        q.go.set()
        await asyncio.wait_for(worker.backstop_passed.wait(), GENEROUS_SECONDS)
        await until(lambda: bool(done), "the job recovered by the backstop ran")
    finally:
        q.go.set()
        worker.stop()
        await task
    assert done[0] > first.fence and q.polling_recoveries == 1


async def test_a_slot_frees_when_the_handler_returns_not_when_its_completion_lands(
    pool: asyncpg.Pool,
) -> None:
    """With concurrency 1 the next job's claim goes side by side with the
    previous job's completion (one round trip less per job), and still no
    two handlers ever run at once. Job 0's completion is held back by a lock
    on its row; jobs 1 and 2 run meanwhile."""
    q = queue(pool, name="overlap")
    await q.enqueue_many([NewJob({"n": n}) for n in range(3)])
    running = peak = 0
    started: list[int] = []
    holder = await pool.acquire()
    hold = holder.transaction()

    async def handler(job: Job) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        started.append(job.payload["n"])
        if job.payload["n"] == 0:  # its completion will wait for this lock
            await hold.start()
            await holder.execute("SELECT 1 FROM fencegate_jobs WHERE id = $1 FOR UPDATE",
                                 job.id)
        await asyncio.sleep(0.01)
        running -= 1

    worker = Worker(q, handler, concurrency=1, poll_min=0.01, poll_max=0.02)
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: len(started) == 3, "jobs 1 and 2 run beside job 0's held "
                    "completion (the held completion kept the slot)")
        assert sorted(started) == [0, 1, 2]
        assert (await q.stats()).get("completed", 0) < 3  # job 0's is still held
    finally:
        if holder.is_in_transaction():
            await hold.rollback()
        await pool.release(holder)

    async def all_completed() -> bool:
        return (await q.stats()).get("completed") == 3

    try:
        await until(all_completed, "all three completed")
    finally:
        worker.stop()
        await task
    assert (await q.stats()) == {"completed": 3}
    assert peak == 1


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
async def test_a_claim_looks_its_jobs_up_and_never_scans_the_table(
    pool: asyncpg.Pool, plan_cache_mode: str,
) -> None:
    """A claim's cost must not grow with the jobs kept for their retention.
    Told that fencegate_claim_lease returns a set's default 1,000 rows, the
    planner joined the claimed leases to the jobs by a hash join over a
    sequential scan of every job: a claim of 8 took 1.9 ms at 8,000 jobs,
    0.9 ms once each job was looked up by its primary key (bench/NOTES.md)."""
    q = Queue(LeaseClient(pool=pool, owner="planner"), "plans")
    for start in range(0, 3000, 500):
        await q.enqueue_many([NewJob({"n": n}) for n in range(start, start + 500)])
    async with pool.acquire() as conn:
        await conn.execute("ANALYZE fencegate_jobs")
        await conn.execute(f"SET plan_cache_mode = {plan_cache_mode}")
        try:
            plan = "\n".join(r[0] for r in await conn.fetch(
                "EXPLAIN " + sql.query("claim_jobs"), "plans", "planner:x", 8, 30.0))
        finally:
            await conn.execute("RESET plan_cache_mode")
    assert "Seq Scan on fencegate_jobs" not in plan, plan
    assert len(await q.claim("planner", limit=8, ttl=30)) == 8


async def test_a_worker_takes_up_what_it_claimed_only_for_the_time_its_leases_have_left(
    pool: asyncpg.Pool,
) -> None:
    """After a claim that got no answer, a worker takes up the jobs claimed
    under its owner: each lease counts as confirmed for no longer than the
    database says it has left, and only the owner's live claims are taken."""
    q = queue(pool, name="takeup")
    await q.enqueue({"n": 1})
    await q.enqueue({"n": 2})
    claimed = await q.claim("w-lost", limit=1, ttl=60)
    assert len(claimed) == 1
    await q.claim("w-other", limit=1, ttl=60)
    # as if half its ttl had passed: 30 s left by the database's clock
    await pool.execute("UPDATE fencegate_leases SET expires_at = clock_timestamp() + "
                       "interval '30 seconds' WHERE owner = 'w-lost'")
    before = clock.now()
    taken = await q.claimed_by("w-lost", 60)
    assert [(j.id, j.fence) for j in taken] == [(claimed[0].id, claimed[0].fence)]
    # 30 s (less the renewal margin) at most, not a fresh ttl of 60 s
    assert taken[0].lease.deadline <= before + 30.0 + 0.05
    assert await q.complete(taken[0])  # its fence is the current one
    assert await q.claimed_by("w-lost", 60) == []


@pytest.mark.parametrize("leases_stats", ["fresh", "one row", "one row over many pages"])
@pytest.mark.parametrize("batch", [1, 8, 100])
async def test_a_completion_reads_its_own_jobs_however_stale_the_statistics(
    pool: asyncpg.Pool, leases_stats: str, batch: int,
) -> None:
    """A completion reads the rows of its own jobs and leases, not every
    claimed job or every lease: its plans, cached on a pooled connection
    while the queue was small (or under statistics that undercount the
    claimed jobs, or show the leases' table as one row, on one page or
    over many as a drained table's do), must not scan the claimed jobs and
    join each to its lease, nor scan the leases for each job. Such plans
    completed a batch of 8 in 135 ms and of 1,000 in 4 s at 60,000 claimed
    jobs."""
    await pool.execute("ALTER TABLE fencegate_jobs SET (autovacuum_enabled = off)")
    await pool.execute("ALTER TABLE fencegate_leases SET (autovacuum_enabled = off)")
    try:
        q = Queue(LeaseClient(pool=pool, owner="stale"), "stale")
        await q.enqueue_many([NewJob({"n": n}) for n in range(20)])
        if leases_stats != "fresh":  # the statistics then show one lease row on one page
            assert len(await q.claim("stale", limit=1, ttl=60)) == 1
        await pool.execute("ANALYZE fencegate_jobs; ANALYZE fencegate_leases")
        if leases_stats == "one row over many pages":
            await pool.execute(
                "SELECT pg_restore_relation_stats("
                " 'schemaname', relnamespace::regnamespace::text, 'relname', relname::text,"
                " 'relpages', 1000, 'reltuples', 1::real)"
                "  FROM pg_class WHERE oid = 'fencegate_leases'::regclass")
        async with pool.acquire() as conn:
            complete = sql.query("complete_jobs")

            async def complete_some(n: int) -> list[int]:
                jobs = await q.claim("stale", limit=n, ttl=60)
                assert len(jobs) == n
                rows = await conn.fetch(complete, [j.id for j in jobs],
                                        [j.fence for j in jobs], [None] * n)
                return [r["id"] for r in rows]

            warm = 1 if batch == 1 else 2  # the path the batch then takes
            for _ in range(8):  # past the calls after which plans are kept
                assert len(await complete_some(warm)) == warm
            for start in range(0, 3000, 500):
                await q.enqueue_many([NewJob({"n": n}) for n in range(start, start + 500)])
            for _ in range(3):
                assert len(await q.claim("stale", limit=1000, ttl=60)) == 1000
            await q.enqueue_many([NewJob({"n": n}) for n in range(max(batch, 8))])
            # the view also holds reads this backend has not flushed yet
            # (PostgreSQL 18): count from a reading taken first
            rows_read = ("SELECT sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0))"
                         "  FROM pg_stat_xact_user_tables"
                         " WHERE relname IN ('fencegate_jobs', 'fencegate_leases')")
            async with conn.transaction():
                before = await conn.fetchval(rows_read)
                if batch == 1:  # as a worker at concurrency 1 completes
                    for _ in range(8):
                        assert len(await complete_some(1)) == 1
                else:
                    assert len(await complete_some(batch)) == batch
                read = await conn.fetchval(rows_read) - before
        assert read < 25 * max(batch, 8), read
    finally:
        await pool.execute("ALTER TABLE fencegate_jobs RESET (autovacuum_enabled)")
        await pool.execute("ALTER TABLE fencegate_leases RESET (autovacuum_enabled)")


async def test_a_batch_completion_looks_each_entry_up_rather_than_scanning_them(
    pool: asyncpg.Pool,
) -> None:
    """A batch's entries are matched to their jobs by key, never compared
    with every job. On tables not yet analyzed (a new database, before
    autovacuum's first ANALYZE) a nested loop scanned the entries once per
    job: 999,000 rows thrown away and about 200 ms for 1,000 completions,
    6.6 s for 8,000, so a large batch outlived its own leases and its late
    completions did not count. Read from the plans PostgreSQL ran
    (auto_explain): no function scan (the entries) runs more than once, and
    no join filter throws away more rows than the batch holds."""
    await pool.execute("ALTER TABLE fencegate_jobs SET (autovacuum_enabled = off)")
    await pool.execute("ALTER TABLE fencegate_leases SET (autovacuum_enabled = off)")
    try:
        q = queue(pool, name="wide", owner="wide")
        # no statistics yet, as on a new database before autovacuum's first
        # ANALYZE: the plan that nested the entries inside the jobs
        await q.enqueue_many([NewJob({"n": n}) for n in range(1000)])
        jobs = await q.claim(limit=1000, ttl=600)
        assert len(jobs) == 1000
        plans: list[str] = []
        def plan(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
            plans.append(message.message)

        async with pool.acquire() as conn:
            conn.add_log_listener(plan)
            try:
                await conn.execute(
                    "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
                    " SET auto_explain.log_nested_statements = on;"
                    " SET auto_explain.log_analyze = on; SET client_min_messages = log")
                rows = await conn.fetch(sql.query("complete_jobs"), [j.id for j in jobs],
                                        [j.fence for j in jobs], [f"r{j.id}" for j in jobs])
                await conn.execute("RESET client_min_messages;"
                                   " RESET auto_explain.log_min_duration")
            finally:
                conn.remove_log_listener(plan)
        assert {r["id"] for r in rows} == {j.id for j in jobs}
        assert any("UPDATE fencegate_jobs" in p for p in plans), plans
        for plan in plans:
            for removed in re.findall(r"Rows Removed by Join Filter: (\d+)", plan):
                assert int(removed) <= len(jobs), plan
            for loops in re.findall(r"Function Scan[^\n]*loops=(\d+)", plan):
                assert int(loops) <= 1, plan
        refs = await pool.fetch("SELECT id, result_ref FROM fencegate_jobs WHERE queue = 'wide'"
                                " AND state = 'completed'")
        assert {r["id"]: r["result_ref"] for r in refs} == {j.id: f"r{j.id}" for j in jobs}
    finally:
        await pool.execute("ALTER TABLE fencegate_jobs RESET (autovacuum_enabled)")
        await pool.execute("ALTER TABLE fencegate_leases RESET (autovacuum_enabled)")


async def test_a_full_batch_of_the_largest_results_completes(pool: asyncpg.Pool) -> None:
    """A worker's largest batch (256 completions) of the largest results a
    job may return (1 MiB each: 256 MiB together) completes in one
    statement: each result is read from the array it came in, and only the
    entries' places go into the jsonb object that matches them to their
    jobs, whose 256 MB limit the results themselves had passed
    (ProgramLimitExceededError for the whole batch, every job run again)."""
    q = queue(pool, name="large", owner="large")
    await q.enqueue_many([NewJob({"n": n}) for n in range(MAX_BATCH)])
    jobs = await q.claim(limit=MAX_BATCH, ttl=600)
    assert len(jobs) == MAX_BATCH

    def result(job: Job) -> str:
        ref = f"{job.id}:"
        return ref + "r" * (MAX_RESULT_BYTES - len(ref))

    assert all(unstorable(result(j)) is None for j in jobs)
    counted = await q.complete_many([(j, result(j)) for j in jobs])
    assert counted == {j.id for j in jobs}
    right = await pool.fetchval(
        "SELECT count(*) FROM fencegate_jobs WHERE queue = 'large' AND state = 'completed'"
        "   AND result_ref = id::text || ':' || repeat('r', $1 - length(id::text) - 1)",
        MAX_RESULT_BYTES)
    assert right == MAX_BATCH
