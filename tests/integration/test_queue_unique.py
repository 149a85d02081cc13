"""Uniqueness by key for a window: while a job is not finished, or for a
period, besides the permanent dedupe_key; enforced by the insert itself, so
enqueuers racing with one key make one job."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.synchronize
import random

import asyncpg
import pytest

from leases import InvalidArgument, LeaseClient, NewJob, Queue
from tests.support.waiting import GENEROUS_SECONDS


def queue(pool: asyncpg.Pool, name: str = "mail") -> Queue:
    return Queue(LeaseClient(pool=pool, owner="w"), name, rng=random.Random(1),
                 recovery_interval=3600)


async def test_a_unique_key_is_held_while_its_job_is_not_finished(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    first = await q.enqueue({"n": 1}, unique_key="sync:acct-1")
    [again] = await q.enqueue_reporting([NewJob({"n": 2}, unique_key="sync:acct-1")])
    assert (again.id, again.deduplicated) == (first, True)
    [job] = await q.claim("w")
    assert await q.enqueue({"n": 3}, unique_key="sync:acct-1") == first  # running: held
    assert await q.complete(job)
    second = await q.enqueue({"n": 4}, unique_key="sync:acct-1")  # completed: free
    assert second != first
    assert (await q.cancel(second)).cancelled
    third = await q.enqueue({"n": 5}, unique_key="sync:acct-1")  # cancelled: free
    assert third not in (first, second)
    assert await q.enqueue({}, unique_key="sync:acct-2") not in (first, second, third)


async def test_a_dead_job_holds_its_key_until_replayed_and_completed(
    pool: asyncpg.Pool,
) -> None:
    q = queue(pool)
    first = await q.enqueue({}, unique_key="k", max_attempts=1)
    [job] = await q.claim("w")
    assert await q.fail(job, "boom") == "dead"
    assert await q.enqueue({}, unique_key="k") == first
    assert await q.replay([first]) == 1  # no other job took the key meanwhile
    [job] = await q.claim("w")
    assert await q.complete(job)
    assert await q.enqueue({}, unique_key="k") != first


async def test_a_unique_key_for_a_period_outlives_its_jobs_completion(
    pool: asyncpg.Pool,
) -> None:
    q = queue(pool)
    first = await q.enqueue({}, unique_key="daily-report", unique_for=86400 * 365)
    [job] = await q.claim("w")
    assert await q.complete(job)
    assert await q.enqueue({}, unique_key="daily-report", unique_for=86400 * 365) == first
    # another period is another window; the key while unfinished is another slot
    assert await q.enqueue({}, unique_key="daily-report", unique_for=3600 * 7) != first
    assert await q.enqueue({}, unique_key="daily-report") != first
    assert (await q.cancel(first)).cancelled is False  # completed: stays so


async def test_a_period_window_ends(pool: asyncpg.Pool) -> None:
    """Windows of a millisecond: enqueues one after another land in new
    windows soon enough (no sleep: each is looked at, none is timed)."""
    q = queue(pool)
    ids = {await q.enqueue({}, unique_key="tick", unique_for=0.001)}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GENEROUS_SECONDS
    while len(ids) < 2 and loop.time() < deadline:
        ids.add(await q.enqueue({}, unique_key="tick", unique_for=0.001))
    assert len(ids) >= 2


async def test_the_outbox_function_honours_unique_keys(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    first = await pool.fetchval(
        "SELECT fencegate_enqueue_job('mail', '{}'::jsonb, unique_key => 'k')")
    assert await pool.fetchval(
        "SELECT fencegate_enqueue_job('mail', '{}'::jsonb, unique_key => 'k')") == first
    assert await q.enqueue({}, unique_key="k") == first
    [job] = await q.claim("w")
    assert await q.complete(job)
    assert await pool.fetchval(
        "SELECT fencegate_enqueue_job('mail', '{}'::jsonb, unique_key => 'k')") != first


async def test_the_outbox_function_refuses_a_bad_window_with_a_clear_error(
        pool: asyncpg.Pool) -> None:
    """A SQL caller's unique_for is checked as enqueue's is: a window under
    0.001 s, zero, negative, NaN or infinite, or a window without a key, is
    an invalid_parameter_value (22023) that says what is wrong, not a
    division by zero or a bigint out of range from deep inside, and
    nothing is enqueued."""
    for bad in ("1e-9", "0", "-1", "'NaN'", "'Infinity'"):
        with pytest.raises(asyncpg.InvalidParameterValueError, match="unique_for"):
            await pool.fetchval("SELECT fencegate_enqueue_job('mail', '{}'::jsonb, "
                                f"unique_key => 'k', unique_for => {bad}::float8)")
    with pytest.raises(asyncpg.InvalidParameterValueError, match="unique_key"):
        await pool.fetchval("SELECT fencegate_enqueue_job('mail', '{}'::jsonb, "
                            "unique_for => 60)")
    assert await pool.fetchval("SELECT count(*) FROM fencegate_jobs") == 0


async def test_unique_arguments_are_checked(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    with pytest.raises(InvalidArgument):
        await q.enqueue_many([NewJob({}, unique_key="k"), NewJob({}, unique_key="k")])
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument):
            await q.enqueue({}, unique_key="k", unique_for=bad)
    with pytest.raises(InvalidArgument):
        await q.enqueue({}, unique_for=60)
    with pytest.raises(InvalidArgument):
        await q.enqueue({}, unique_key="")
    assert await q.stats() == {}


async def test_a_batch_mixes_unique_dedupe_and_plain_jobs(pool: asyncpg.Pool) -> None:
    q = queue(pool)
    held = await q.enqueue({}, unique_key="u1")
    done = await q.enqueue_reporting([
        NewJob({"n": 0}), NewJob({"n": 1}, unique_key="u1"), NewJob({"n": 2}, dedupe_key="d"),
        NewJob({"n": 3}, unique_key="u2"), NewJob({"n": 4})])
    assert [d.deduplicated for d in done] == [False, True, False, False, False]
    assert done[1].id == held
    assert len({d.id for d in done}) == 5
    payloads = {r["id"]: r["payload"]["n"] for r in await q.list() if r["payload"]}
    assert [payloads[d.id] for d in (done[0], done[2], done[3], done[4])] == [0, 2, 3, 4]


def _enqueue_many(dsn: str, start: multiprocessing.synchronize.Barrier,
                  answers: multiprocessing.Queue[list[int]]) -> None:
    async def main() -> list[int]:
        pool = await asyncpg.create_pool(dsn, min_size=8, max_size=8)
        q = Queue(LeaseClient(pool=pool), "race")

        async def one(i: int) -> int:
            if i % 2:
                return await q.enqueue({"i": i}, unique_key="only-one", unique_for=3600)
            got: int = await pool.fetchval(
                "SELECT fencegate_enqueue_job('race', '{}'::jsonb, unique_key => 'only-one', "
                "unique_for => 3600)")
            return got

        await asyncio.to_thread(start.wait)  # every process connected: go at once
        got = await asyncio.gather(*(one(i) for i in range(40)))
        await pool.close()
        return list(got)

    answers.put(asyncio.run(main()))


async def test_enqueuers_racing_with_one_unique_key_make_one_job(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(4)
    answers: multiprocessing.Queue[list[int]] = ctx.Queue()
    procs = [ctx.Process(target=_enqueue_many, args=(dsn, start, answers)) for _ in range(3)]
    for p in procs:
        p.start()
    try:
        await asyncio.to_thread(start.wait, GENEROUS_SECONDS * 2)
        got = [await asyncio.to_thread(answers.get, True, GENEROUS_SECONDS * 2) for _ in procs]
        for p in procs:
            await asyncio.to_thread(p.join, GENEROUS_SECONDS)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    ids = {i for answer in got for i in answer}
    assert len(ids) == 1
    assert await pool.fetchval("SELECT count(*) FROM fencegate_jobs WHERE queue = 'race'") == 1
