"""Lease rule 4 on the queue: a job's lease past ``expires_at`` is dead, and
its fence records nothing: not a completion, not a failure, whether or not
recovery has looked at the job yet (so the outcome of a late statement does
not hang on a race with the recovery sweep), as ``fencegate_check_fence``
refuses a lapsed lease with ``lease_expired``."""

from __future__ import annotations

import asyncpg
import pytest

from leases import LeaseClient, Queue
from tests.support.lapse import lapse


@pytest.mark.parametrize("call", ["complete", "complete_many", "fail"])
async def test_a_lapsed_lease_records_nothing(pool: asyncpg.Pool, call: str) -> None:
    q = Queue(LeaseClient(pool=pool, owner="w1"), "mail", recovery_interval=3600)
    job_id = await q.enqueue({"n": 1})
    [job] = await q.claim("w1", ttl=30)
    # its ttl has run out (the holder stalled); recovery has not looked since
    await lapse(pool, after=[q])
    if call == "complete":
        assert await q.complete(job, "late") is False
    elif call == "complete_many":
        assert await q.complete_many([(job, "late")]) == set()
    else:
        assert await q.fail(job, "late") is None
    row = await pool.fetchrow("SELECT state, result_ref, last_error FROM fencegate_jobs "
                              "WHERE id = $1", job_id)
    assert row is not None and tuple(row) == ("claimed", None, None)
    assert await q.recover() == 1
