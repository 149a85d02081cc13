"""A job whose result cannot be stored costs only itself: the jobs completed
beside it count, and it fails with the real reason."""

from __future__ import annotations

import asyncpg
import pytest

from tests.support.working import run_four


@pytest.mark.parametrize("bad", ["ref\x00", 42, "\ud800"])
async def test_an_unstorable_result_fails_only_its_own_job(
    pool: asyncpg.Pool, bad: object,
) -> None:
    """Four jobs finish in the same turn, so their completions go as one
    batch. Job 0's result cannot be stored (PostgreSQL text holds no NUL, a
    number is not a result reference, a lone surrogate is not UTF-8): the
    other three complete on their first attempt, and job 0 fails each of its
    attempts with the reason its result could not be stored."""
    rows = await run_four(pool, bad, max_attempts=3)
    assert (rows[0]["state"], rows[0]["attempts"]) == ("dead", 3)
    assert "its result could not be stored" in rows[0]["last_error"]
