"""The Python side of fenced writes: ``lease.transaction(conn)``,
``job.transaction(conn)`` with ``queue.complete(job, connection=conn)``, and
``queue.enqueue(..., connection=conn)`` (the outbox).

The invariants: the caller's writes and the job's completion commit together
or not at all; a zombie's (an older fence's) writes roll back and it gets
``FenceRefused``; a job enqueued in a transaction exists only if it commits;
a worker whose handler completed its job in its own transaction does not
complete it again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from leases import FenceRefused, LeaseClient, LeaseLost, Queue, Worker
from tests.support.lapse import lapse
from tests.support.waiting import until


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute("CREATE TABLE charges (job bigint PRIMARY KEY, amount int NOT NULL)")
    yield c
    await c.close()


async def test_a_lease_transaction_commits_under_its_fence_and_a_zombies_rolls_back(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    a = LeaseClient(pool=pool, owner="a")
    old = await a.claim("acct:1", ttl=30)
    assert old is not None
    async with old.transaction(conn):
        await conn.execute("INSERT INTO charges VALUES (1, 10)")
    # its lease lapses unnoticed (it stalled) and another owner claims
    await pool.execute("UPDATE fencegate_leases SET expires_at = clock_timestamp()"
                       " WHERE resource = 'acct:1'")
    new = await LeaseClient(pool=pool, owner="b").claim("acct:1", ttl=30)
    assert new is not None
    with pytest.raises(FenceRefused) as refused:
        async with old.transaction(conn):
            await conn.execute("INSERT INTO charges VALUES (2, 20)")
    assert refused.value.code == "stale_fence"
    assert isinstance(refused.value, LeaseLost)
    assert await pool.fetchval("SELECT array_agg(job ORDER BY job) FROM charges") == [1]


async def test_a_lease_known_lost_here_commits_nothing(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    """Lost-ownership mode: no one last commit, even if the database would
    still take it."""
    lease = await LeaseClient(pool=pool, owner="a").claim("acct:1", ttl=30)
    assert lease is not None
    with pytest.raises(LeaseLost):
        async with lease.transaction(conn):
            await conn.execute("INSERT INTO charges VALUES (1, 10)")
            lease._lose("unreachable", "renewals got no answer")  # as the keeper would
    assert await pool.fetchval("SELECT count(*) FROM charges") == 0


async def test_writes_and_completion_commit_together(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    client = LeaseClient(pool=pool, owner="w")
    queue = Queue(client, "charges")
    job_id = await queue.enqueue({"amount": 5})
    [job] = await queue.claim(ttl=30)
    async with job.transaction(conn):
        await conn.execute("INSERT INTO charges VALUES ($1, 5)", job.id)
        assert await queue.complete(job, "charge-1", connection=conn) is True
    row = await pool.fetchrow("SELECT state, result_ref FROM fencegate_jobs WHERE id = $1",
                              job_id)
    assert (row["state"], row["result_ref"]) == ("completed", "charge-1")
    assert await pool.fetchval("SELECT count(*) FROM charges") == 1


async def test_a_rolled_back_completion_leaves_the_job_to_run_again(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    client = LeaseClient(pool=pool, owner="w")
    queue = Queue(client, "charges")
    job_id = await queue.enqueue({"amount": 5})
    [job] = await queue.claim(ttl=30)
    with pytest.raises(RuntimeError):
        async with job.transaction(conn):
            await conn.execute("INSERT INTO charges VALUES ($1, 5)", job.id)
            await queue.complete(job, connection=conn)
            raise RuntimeError("the handler's next step failed")
    assert await pool.fetchval("SELECT state FROM fencegate_jobs WHERE id = $1",
                               job_id) == "claimed"
    assert await pool.fetchval("SELECT count(*) FROM charges") == 0


async def test_a_zombies_completion_raises_and_its_writes_roll_back(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    queue = Queue(LeaseClient(pool=pool, owner="zombie"), "charges")
    job_id = await queue.enqueue({"amount": 5})
    [zombie] = await queue.claim(ttl=30)
    # its lease lapses (it stalled) and another worker takes the job
    await lapse(pool, zombie.lease.resource, after=[queue])
    assert await queue.recover() == 1
    assert await pool.fetchval("SELECT state FROM fencegate_jobs WHERE id = $1",
                               job_id) == "queued"
    [taker] = await Queue(LeaseClient(pool=pool, owner="taker"), "charges").claim(ttl=30)
    assert taker.fence > zombie.fence
    with pytest.raises(FenceRefused) as refused:
        async with conn.transaction():
            await conn.execute("INSERT INTO charges VALUES ($1, 5)", job_id)
            await queue.complete(zombie, connection=conn)
    assert refused.value.code == "stale_fence"
    assert await pool.fetchval("SELECT count(*) FROM charges") == 0
    assert await pool.fetchval("SELECT state FROM fencegate_jobs WHERE id = $1",
                               job_id) == "claimed"


async def test_a_completion_repeated_after_it_committed_is_refused(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    """A transaction retried because its commit's answer was lost must not
    write twice: the second completion raises and its writes roll back."""
    queue = Queue(LeaseClient(pool=pool, owner="w"), "charges")
    await queue.enqueue({"amount": 5})
    [job] = await queue.claim(ttl=30)
    async with conn.transaction():
        await conn.execute("INSERT INTO charges VALUES ($1, 5)", job.id)
        await conn.execute("SELECT fencegate_complete_job('charges', $1, $2)",
                           job.id, job.fence)
    with pytest.raises(asyncpg.PostgresError) as raised:
        async with conn.transaction():
            await conn.execute("UPDATE charges SET amount = amount + 5")
            await conn.execute("SELECT fencegate_complete_job('charges', $1, $2)",
                               job.id, job.fence)
    assert (raised.value.sqlstate, raised.value.args[0]) == ("FG412", "lease_expired")
    assert await pool.fetchval("SELECT amount FROM charges") == 5


async def test_a_job_enqueued_in_a_rolled_back_transaction_never_exists(
        pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    queue = Queue(LeaseClient(pool=pool, owner="w"), "mail")
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await queue.enqueue({"to": "a@example.com"}, dedupe_key="order-1",
                                connection=conn)
            raise RuntimeError("the order was not placed")
    assert await pool.fetchval("SELECT count(*) FROM fencegate_jobs") == 0
    async with conn.transaction():
        first = await queue.enqueue({"to": "a@example.com"}, dedupe_key="order-1",
                                    connection=conn)
    again = await conn.fetchval("SELECT fencegate_enqueue_job('mail', '{}'::jsonb, 'order-1')")
    assert again == first
    plain = await conn.fetchval("SELECT fencegate_enqueue_job('mail', '{\"n\": 1}'::jsonb)")
    assert plain != first
    assert await pool.fetchval("SELECT max_attempts FROM fencegate_jobs WHERE id = $1",
                               plain) == 5


async def test_a_worker_whose_handler_completed_in_its_transaction(
        pool: asyncpg.Pool, dsn: str) -> None:
    client = LeaseClient(pool=pool, owner="w")
    queue = Queue(client, "charges")
    job_id = await queue.enqueue({"amount": 7})
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE charges (job bigint PRIMARY KEY, amount int NOT NULL)")

    async def handler(job):  # type: ignore[no-untyped-def]
        async with job.transaction(conn):
            await conn.execute("INSERT INTO charges VALUES ($1, $2)", job.id,
                               job.payload["amount"])
            await queue.complete(job, "done-in-tx", connection=conn)
        await asyncio.sleep(0)  # the worker's lease block goes on without renewals

    worker = Worker(queue, handler, concurrency=1)
    running = asyncio.create_task(worker.run())
    try:
        await until(lambda: _state(pool, job_id, "completed"), "the job completed")
    finally:
        worker.stop()
        await running
    row = await pool.fetchrow("SELECT result_ref, attempts FROM fencegate_jobs WHERE id = $1",
                              job_id)
    assert (row["result_ref"], row["attempts"]) == ("done-in-tx", 1)
    await conn.close()


async def _state(pool: asyncpg.Pool, job_id: int, state: str) -> bool:
    return bool(await pool.fetchval("SELECT state = $2 FROM fencegate_jobs WHERE id = $1",
                                    job_id, state))
