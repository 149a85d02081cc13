"""The queue's recovery and purge statements against claims that run at the
same moment (READ COMMITTED snapshots inside one statement): recovery never
requeues a job claimed again, purge never deletes a lease that became live,
and completions and recoveries lock leases in resource order.

Each test holds one row lock in an open transaction for a moment: what a
slow statement (a claim, a renewal, an admission whose commit waits on a slow
disk) does in production. Everything else is the product's own statements on
a real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import random

import asyncpg

from leases import LeaseClient, Queue, sql
from leases.completion import Completions
from leases.queue import Job, NewJob, job_resource
from tests.support.lapse import lapse
from tests.support.locks import until_waiting


def queue(pool: asyncpg.Pool, owner: str, name: str = "mail", **kw: object) -> Queue:
    return Queue(LeaseClient(pool=pool, owner=owner), name, rng=random.Random(1),
                 recovery_interval=3600, **kw)  # type: ignore[arg-type]


async def test_recovery_does_not_requeue_a_job_claimed_again_while_it_ran(
    pool: asyncpg.Pool,
) -> None:
    """recover_jobs reads the job in its `locked` CTE from the statement's
    snapshot (``JOIN fencegate_jobs j``), but locks and reads the lease row in
    its latest version. A job that was recovered by another claimer and claimed
    again (new fence F2, live lease) between that snapshot and this statement's
    lock on it therefore looks like "lease moved to another fence" (snapshot
    F1 <> latest F2) and is put back in the queue under its live holder.

    Then the live holder's complete() is refused (state is no longer
    'claimed'), and once its lease ends the job is claimed and run again.
    """
    dead = queue(pool, "dead-worker")
    j1 = await dead.enqueue({"n": 1})
    j2 = await dead.enqueue({"n": 2})
    claimed = await dead.claim(limit=2, ttl=30)
    assert sorted(j.id for j in claimed) == [j1, j2]
    await lapse(pool, after=[dead])  # the dead worker's claims expire

    # a slow statement holds job 1's lease row for a moment
    locker = await pool.acquire()
    tx = locker.transaction()
    await tx.start()
    await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1 "
                         "FOR NO KEY UPDATE", job_resource("mail", j1))

    # recovery R1 takes its snapshot, locks job 1, and waits for job 1's lease row
    r1 = asyncio.create_task(queue(pool, "r1").recover())
    await until_waiting(pool, "over AS")

    # meanwhile another claimer's recovery brings job 2 back, and worker c claims it
    assert await queue(pool, "r2").recover() == 1
    c = queue(pool, "worker-c")
    [job_c] = await c.claim(limit=1, ttl=30)
    assert job_c.id == j2
    assert (await LeaseClient(pool=pool).show(job_c.resource)).live  # type: ignore[union-attr]

    await tx.rollback()
    await pool.release(locker)
    await r1

    state, fence = await pool.fetchrow(
        "SELECT state, fence FROM fencegate_jobs WHERE id = $1", j2)
    assert (state, fence) == ("claimed", job_c.fence), (
        f"recovery put job {j2} back to {state!r} while worker-c holds its live lease "
        f"(fence {job_c.fence})")
    assert await c.complete(job_c) is True, "the live holder's completion was refused"


async def test_purge_does_not_delete_a_lease_that_became_live_during_the_purge(
    pool: asyncpg.Pool,
) -> None:
    """purge_jobs decides which lease rows are "busy" (live, or draining an
    effect) from the statement's snapshot, then deletes them with a DELETE
    whose condition is only the resource name. A claim of job:<queue>:<id>
    that commits after the snapshot (the lease row's lock was held while the
    purge started) is deleted all the same: the live lease disappears, a
    third party claims the resource at once, and the first holder's drain
    barrier (its effect in flight) is gone with the row.
    """
    q = queue(pool, "w1", retention_seconds=60)
    job_id = await q.enqueue({"n": 1})
    [job] = await q.claim(limit=1, ttl=30)
    assert await q.complete(job) is True
    await pool.execute("UPDATE fencegate_jobs SET finished_at = finished_at - "
                       "interval '1 hour'")  # as if past its retention
    resource = job_resource("mail", job_id)

    # someone claims the finished job's resource outside the queue (the
    # queue's own recovery treats that as a case it handles); the claim's
    # transaction is still open when the purge starts
    claimer = await pool.acquire()
    tx = claimer.transaction()
    await tx.start()
    outside = await claimer.fetchrow(sql.query("claim_lease"), resource, "outsider", 30.0)
    assert outside is not None
    # and an effect under it is admitted in the same breath (as the gateway does)
    verdict = await claimer.fetchval(
        "SELECT verdict FROM fencegate_admit_effect('agents', 'k', '\\x00'::bytea, $1, $2, "
        "'hook', 1, 60.0, 0, 5.0)", resource, outside["fence"])
    assert verdict == "admitted"

    purge = asyncio.create_task(q.purge())
    await until_waiting(pool, "leases_gone")
    await tx.commit()
    await pool.release(claimer)
    await purge

    row = await pool.fetchrow("SELECT fence, inflight FROM fencegate_leases WHERE "
                              "resource = $1", resource)
    assert row is not None, (
        "the purge deleted a live lease with an effect in flight (drain barrier gone)")
    # what that allows: another owner claims at once, while fence
    # outside["fence"]'s effect may still be reaching the provider
    assert await LeaseClient(pool=pool, owner="third").claim(resource, ttl=30) is None


async def test_completing_jobs_locks_their_leases_in_resource_order(
    pool: asyncpg.Pool,
) -> None:
    """One lock order everywhere: every statement that locks several lease
    rows locks them in the order of their resource (the batches of claims,
    renewals and releases do). A batch completion of jobs 9 and 10 against a
    transaction that locks their lease rows in resource order (job:mail:10,
    then job:mail:9): taken in the order of the ids, the two deadlocked and
    PostgreSQL aborted one of them."""
    q = queue(pool, "w")
    await q.enqueue_many([NewJob({"n": n}) for n in range(1, 11)])
    claimed = await q.claim("w:1", limit=10, ttl=60)
    # jobs 9 and 10: in resource order job:mail:10 comes first
    jobs = sorted((j for j in claimed if j.id in (9, 10)), key=lambda j: job_resource(
        q.name, j.id))
    assert [j.id for j in jobs] == [10, 9]
    first, second = (job_resource(q.name, j.id) for j in jobs)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1"
                           " FOR NO KEY UPDATE", first)
        completing = asyncio.ensure_future(
            q.complete_many([(jobs[1], None), (jobs[0], None)]))  # 9, 10
        await until_waiting(pool, "complete_job")
        # the completion waits for the first row; the second is not its yet
        await conn.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1"
                           " FOR NO KEY UPDATE", second)
    assert await asyncio.wait_for(completing, 60) == {jobs[0].id, jobs[1].id}


async def test_recovering_jobs_locks_their_leases_in_resource_order(
    pool: asyncpg.Pool,
) -> None:
    """Recovery of expired jobs 9 and 10 against a transaction that locks their
    lease rows in resource order (job:mail:10, then job:mail:9): recovery too
    locks lease rows in that order, so neither is aborted as a deadlock."""
    q = queue(pool, "w")
    await q.enqueue_many([NewJob({"n": n}) for n in range(1, 11)])
    await q.claim("w:1", limit=10, ttl=60)
    await lapse(pool, after=[q])
    first, second = job_resource(q.name, 10), job_resource(q.name, 9)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1"
                           " FOR NO KEY UPDATE", first)
        recovering = asyncio.ensure_future(queue(pool, "r").recover())
        await until_waiting(pool, "over AS")
        await conn.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1"
                           " FOR NO KEY UPDATE", second)
    assert await asyncio.wait_for(recovering, 60) == 10


async def test_a_zombie_s_batches_racing_the_holder_s_and_cancels_count_only_the_holder(
    pool: asyncpg.Pool,
) -> None:
    """Round after round: a worker claims 48 jobs and stalls past their
    leases; they are recovered and claimed again, under higher fences, by a
    second worker. Then, all at once on connections of their own: the
    zombie's batch completions of every job under its old fences, the
    holder's batch completions of every job under the current ones (batches
    of 1, 2, 8 and 37: the path by key and the set-based one), and cancels of
    a random half. The zombie counts nothing; each job is completed by its
    holder or cancelled, exactly one of the two; a completed job keeps its
    holder's result; no job's lease outlives its end."""
    rng = random.Random(28)
    zombie, holder, admin = queue(pool, "zombie"), queue(pool, "holder"), queue(pool, "admin")
    for round_ in range(6):
        await zombie.enqueue_many([NewJob({"round": round_, "n": n}) for n in range(48)])
        stale = await zombie.claim("zombie:1", limit=48, ttl=60)
        assert len(stale) == 48
        await lapse(pool, after=[zombie, holder])
        assert await admin.recover() == 48
        current = await holder.claim("holder:1", limit=48, ttl=60)
        assert {j.id for j in current} == {j.id for j in stale}
        rng.shuffle(stale)
        rng.shuffle(current)
        cancelled_ids = rng.sample([j.id for j in current], 24)

        def batches(jobs: list[Job], ref: str) -> list[list[tuple[Job, str]]]:
            out, i = [], 0
            for size in (1, 2, 8, 37):
                out.append([(j, f"{ref}:{j.id}") for j in jobs[i:i + size]])
                i += size
            return out

        async def cancel(job_id: int) -> tuple[int, bool]:
            return job_id, (await admin.cancel(job_id)).cancelled

        zombie_calls = [zombie.complete_many(b) for b in batches(stale, "zombie")]
        holder_calls = [holder.complete_many(b) for b in batches(current, "holder")]
        cancel_calls = [cancel(i) for i in cancelled_ids]
        calls = [*zombie_calls, *holder_calls, *cancel_calls]
        order = list(range(len(calls)))
        rng.shuffle(order)
        answers = await asyncio.gather(*(calls[i] for i in order))
        answered = dict(zip(order, answers, strict=True))
        zombie_counted = set().union(*(answered[i] for i in range(4)))
        holder_counted = set().union(*(answered[i] for i in range(4, 8)))
        cancelled = {job_id for job_id, ok in (answered[i] for i in range(8, len(calls)))
                     if ok}
        assert zombie_counted == set(), f"round {round_}: the zombie counted {zombie_counted}"
        assert holder_counted.isdisjoint(cancelled), f"round {round_}: both for " \
            f"{holder_counted & cancelled}"
        assert holder_counted | cancelled == {j.id for j in current}, f"round {round_}"
        rows = await pool.fetch(
            "SELECT j.id, j.state, j.result_ref, l.expires_at > clock_timestamp() AS live "
            "FROM fencegate_jobs j LEFT JOIN fencegate_leases l "
            "ON l.resource = 'job:' || j.queue || ':' || j.id WHERE j.id = ANY($1::bigint[])",
            [j.id for j in current])
        for row in rows:
            if row["id"] in holder_counted:
                assert (row["state"], row["result_ref"]) == (
                    "completed", f"holder:{row['id']}"), dict(row)
            else:
                assert (row["state"], row["result_ref"]) == ("cancelled", None), dict(row)
            assert not row["live"], dict(row)


async def test_a_batch_completion_aborted_as_a_deadlock_goes_again_job_by_job(
    pool: asyncpg.Pool,
) -> None:
    """A caller's transaction completing two jobs, the higher id first,
    holds job b's rows and waits for job a's, while a worker's batch of a, b
    and c holds a's and waits for b's: PostgreSQL aborts one of the two as a
    deadlock. When it aborts the batch, each of its entries goes again alone:
    c, whose fence was current all along, counts, rather than its lease
    lapsing and the job running again. (The caller's session waits longer
    before it looks for a deadlock, so the batch is the one aborted.)"""
    old, new = queue(pool, "old"), queue(pool, "new")
    await old.enqueue_many([NewJob({"n": n}) for n in range(3)])
    a, b, c = sorted(await old.claim("old:1", limit=3, ttl=60), key=lambda j: j.id)
    await lapse(pool, a.resource, b.resource, after=[old])
    assert await queue(pool, "r").recover() == 2
    again = {j.id: j for j in await new.claim("new:1", limit=2, ttl=60)}
    assert set(again) == {a.id, b.id}
    completions = Completions(old)
    async with pool.acquire() as conn:
        await conn.execute("SET deadlock_timeout = '30s'")
        try:
            async with conn.transaction():
                assert await new.complete(again[b.id], "new b", connection=conn)
                counted = [completions.complete(j, f"old {j.id}") for j in (a, b, c)]
                await until_waiting(pool, "fencegate_complete_jobs")
                assert await new.complete(again[a.id], "new a", connection=conn)
        finally:
            await conn.execute("RESET deadlock_timeout")
    assert [await asyncio.wait_for(f, 60) for f in counted] == [False, False, True]
    await completions.close(5)
    rows = await pool.fetch("SELECT id, state, result_ref FROM fencegate_jobs ORDER BY id")
    assert [tuple(r) for r in rows] == [(a.id, "completed", "new a"),
                                        (b.id, "completed", "new b"),
                                        (c.id, "completed", f"old {c.id}")]
