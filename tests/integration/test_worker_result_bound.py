"""A handler's result is a reference (``result_ref``: a key, a URL, an id),
stored in the job's row: at most ``MAX_RESULT_BYTES`` (1 MiB) of UTF-8. A
larger one is refused before it is sent, and fails only its own job with
that reason; the jobs completed beside it in the same statement count."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import pytest

from leases import LeaseClient, Queue, RetryPolicy, Worker
from leases.completion import MAX_RESULT_BYTES, unstorable
from leases.queue import Job
from tests.support.working import run_worker_until


async def run_four(pool: asyncpg.Pool, first: str) -> dict[int, asyncpg.Record]:
    """Four jobs that return in the same turn (one batch of completions):
    the first returns ``first``, the others "ok"; their rows by position."""
    q = Queue(LeaseClient(pool=pool, owner="w1"), "mail", rng=random.Random(1),
              retry=RetryPolicy(max_attempts=2, base_seconds=0.01, cap_seconds=0.02),
              recovery_interval=0.05)
    ids = [await q.enqueue({"n": n}) for n in range(4)]
    started: set[int] = set()
    all_started = asyncio.Event()

    async def handler(job: Job) -> str:
        started.add(job.id)
        if len(started) >= 4:
            all_started.set()
        await all_started.wait()
        return first if job.id == ids[0] else "ok"

    worker = Worker(q, handler, concurrency=4, poll_min=0.01, poll_max=0.02)
    await run_worker_until(
        worker, pool, "SELECT count(*) FROM fencegate_jobs WHERE state IN ('queued', 'claimed')")
    rows = {r["id"]: r for r in await pool.fetch(
        "SELECT id, state, attempts, octet_length(result_ref) AS size, last_error "
        "FROM fencegate_jobs")}
    for job_id in ids[1:]:
        assert (rows[job_id]["state"], rows[job_id]["attempts"]) == ("completed", 1)
    return {n: rows[job_id] for n, job_id in enumerate(ids)}


@pytest.mark.parametrize("result", [
    "x" * (MAX_RESULT_BYTES + 1),
    "é" * (MAX_RESULT_BYTES // 2 + 1),  # fewer characters than the bound, more bytes
    "x" * (30 * 1024 * 1024),  # tens of MB
], ids=["just-over", "multibyte", "30MB"])
async def test_a_result_over_the_bound_fails_only_its_own_job(
    pool: asyncpg.Pool, result: str,
) -> None:
    rows = await run_four(pool, result)
    assert (rows[0]["state"], rows[0]["attempts"], rows[0]["size"]) == ("dead", 2, None)
    assert "its result could not be stored" in rows[0]["last_error"]
    assert "1 MiB" in rows[0]["last_error"], rows[0]["last_error"]


async def test_a_result_at_the_bound_is_stored(pool: asyncpg.Pool) -> None:
    rows = await run_four(pool, "é" * (MAX_RESULT_BYTES // 2))
    assert (rows[0]["state"], rows[0]["size"]) == ("completed", MAX_RESULT_BYTES)


def test_beyond_what_postgresql_text_holds_is_refused_without_encoding_it() -> None:
    """Past PostgreSQL's 1 GB limit the statement itself would fail, taking
    the batch with it. The length is checked first, by characters (each is
    at least one byte), so even such a result is refused at once."""
    class Huge(str):
        def __len__(self) -> int:
            return 2**30 + 1

        def encode(self, *args: object, **kw: object) -> bytes:
            raise AssertionError("encoded")

    why = unstorable(Huge("x"))
    assert why is not None and "1 MiB" in why
