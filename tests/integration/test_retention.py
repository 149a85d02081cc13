"""Tables that do not only grow, and recovery that does not depend on the
lease staying as the queue left it (issue 9)."""

from __future__ import annotations

import asyncio
import logging
import random

import asyncpg
import pytest

from gateway.ledger import Ledger
from leases import LeaseClient, Queue, Worker
from leases.metrics import AWAITING_PURGE
from leases.queue import job_resource
from tests.support.lapse import lapse
from tests.support.waiting import until


def _queue(pool: asyncpg.Pool, owner: str, **kw: object) -> Queue:
    return Queue(LeaseClient(pool=pool, owner=owner), "mail", rng=random.Random(1),
                 recovery_interval=3600, **kw)  # type: ignore[arg-type]


async def _past_retention(pool: asyncpg.Pool) -> None:
    """As if the queue's retention had passed since its jobs finished."""
    await pool.execute("UPDATE fencegate_jobs SET finished_at = finished_at - interval '1 hour'")


async def test_the_effect_purge_catches_up_in_one_pass(pool: asyncpg.Pool) -> None:
    """It deleted at most 1,000 effects per 10 minutes per process: about
    1.7 a second, less than a busy gateway records."""
    await pool.execute("""
        INSERT INTO fencegate_effects (client, idempotency_key, fingerprint, resource, fence,
                                       provider, state, deadline, response_status, updated_at)
        SELECT 'agents', 'old-' || i, '\\x00', 'run:1', 1, 'mail', 'succeeded',
               clock_timestamp(), 200, clock_timestamp() - interval '8 days'
          FROM generate_series(1, 2500) AS i""")
    await pool.execute("""
        INSERT INTO fencegate_effects (client, idempotency_key, fingerprint, resource, fence,
                                       provider, state, deadline, updated_at)
        VALUES ('agents', 'old-unknown', '\\x00', 'run:1', 1, 'mail', 'unknown',
                clock_timestamp(), clock_timestamp() - interval '8 days'),
               ('agents', 'recent', '\\x00', 'run:1', 1, 'mail', 'unknown',
                clock_timestamp(), clock_timestamp())""")
    ledger = Ledger(LeaseClient(pool=pool, timeout=5))
    assert await ledger.awaiting_purge(7 * 86400) == 2500
    assert await ledger.purge(7 * 86400, batch=1000) == 2500
    assert await ledger.awaiting_purge(7 * 86400) == 0
    left = {r[0] for r in await pool.fetch("SELECT idempotency_key FROM fencegate_effects")}
    assert left == {"old-unknown", "recent"}  # an unknown outcome is never purged


async def test_finished_jobs_go_with_their_leases_after_retention(pool: asyncpg.Pool) -> None:
    """Completed and dead jobs, and every job:<queue>:<id> lease row, stayed
    for ever."""
    q = _queue(pool, "w", retention_seconds=60)
    ids = [await q.enqueue({"n": i}) for i in range(5)]
    jobs = await q.claim(limit=5, ttl=30)
    for job in jobs[:3]:
        assert await q.complete(job)
    assert await q.fail(jobs[3], "gave up") in ("queued", "dead")
    await pool.execute("UPDATE fencegate_jobs SET state = 'dead', finished_at = "
                       "clock_timestamp() WHERE id = $1", jobs[3].id)
    await _past_retention(pool)
    fences = {j.id: j.fence for j in jobs}
    assert await q.purge() == 4
    # the job still claimed stays, with its lease; the rest are gone with theirs
    assert {r[0] for r in await pool.fetch("SELECT id FROM fencegate_jobs")} == {jobs[4].id}
    assert {r[0] for r in await pool.fetch("SELECT resource FROM fencegate_leases")} == \
        {job_resource("mail", jobs[4].id)}
    assert AWAITING_PURGE.labels(table="jobs")._value.get() == 0
    # a claim of a purged job's resource cannot get a fence issued before
    again = await LeaseClient(pool=pool, owner="x").claim(job_resource("mail", ids[0]), ttl=5)
    assert again is not None and again.fence > max(fences.values())


async def test_a_purge_keeps_a_finished_jobs_lease_while_it_is_live(pool: asyncpg.Pool) -> None:
    q = _queue(pool, "w", retention_seconds=60)
    job_id = await q.enqueue({})
    [job] = await q.claim(ttl=30)
    assert await q.complete(job)
    # someone holds the finished job's resource again, outside the queue
    outside = await LeaseClient(pool=pool, owner="o").claim(job_resource("mail", job_id), ttl=30)
    assert outside is not None
    await _past_retention(pool)
    assert await q.purge() == 0
    assert await pool.fetchval("SELECT count(*) FROM fencegate_leases") == 1


async def test_a_job_whose_lease_was_claimed_outside_the_queue_is_recovered(
    pool: asyncpg.Pool,
) -> None:
    """Recovery looked for an expired lease under the job's fence: a claim of
    job:<queue>:<id> by anyone else left the job claimed for ever."""
    q = _queue(pool, "w")
    job_id = await q.enqueue({"n": 1})
    [job] = await q.claim(ttl=30)
    await lapse(pool, after=[q])  # the worker died; its claim expired
    outsider = LeaseClient(pool=pool, owner="outsider")
    taken = await outsider.claim(job.resource, ttl=30)
    assert taken is not None and taken.fence > job.fence
    assert await q.recover() == 1
    state = await pool.fetchval("SELECT state FROM fencegate_jobs WHERE id = $1", job_id)
    assert state == "queued"
    assert await q.complete(job) is False  # the dead worker's fence counts for nothing
    await lapse(pool)  # the outsider's lease lapses; the queue claims it again
    [again] = await _queue(pool, "w2").claim(ttl=30)
    assert again.id == job_id and again.fence > taken.fence


async def test_a_worker_keeps_going_when_its_claims_fail_for_other_reasons(
    pool: asyncpg.Pool, dsn: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A read-only database (after a failover, before the pooler moves), a
    statement timeout, a deadlock: Worker.run died on any error but an
    unreachable database."""
    done: list[int] = []

    async def handle(job: object) -> None:
        done.append(job.id)  # type: ignore[attr-defined]

    client = LeaseClient(dsn, owner="w")
    q = Queue(client, "mail", recovery_interval=3600)
    worker = Worker(q, handle, poll_min=0.01, poll_max=0.05, backstop_interval=3600)
    database = await pool.fetchval("SELECT current_database()")
    await pool.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    await pool.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = $1 AND pid <> pg_backend_pid()", database)
    caplog.set_level(logging.WARNING, logger="fencegate.worker")

    def read_only_claims() -> int:
        return sum(1 for r in caplog.records if r.getMessage().startswith("claim failed")
                   and "ReadOnlySQLTransaction" in r.getMessage())

    run = asyncio.create_task(worker.run())
    # every claim fails, read-only: three of them have, and it is still running
    await until(lambda: read_only_claims() >= 3 or run.done(), "three read-only claims")
    assert not run.done(), run.exception() if run.done() else None
    await pool.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = off')
    await pool.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = $1 AND pid <> pg_backend_pid()", database)
    await pool.expire_connections()  # ours too: writable again (the worker's reconnect)
    job_id = await _queue(pool, "producer").enqueue({"n": 1})
    try:
        await until(lambda: bool(done), "the job handled once writable again")
    finally:
        worker.stop()
    await asyncio.wait_for(run, 10)
    await client.close()
    assert done == [job_id]
