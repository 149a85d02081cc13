"""A handler's error is stored as the job's ``last_error`` whatever its
message holds: a NUL (which PostgreSQL text cannot hold), a lone surrogate
(not UTF-8), or a ``__str__`` that raises. The failure is recorded with its
backoff like any other, never lost to a refused statement (the job would
then wait for recovery, without its backoff or its reason) nor escaping the
job's task."""

from __future__ import annotations

import asyncpg
import pytest

from tests.support.working import run_failing_once


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@pytest.mark.parametrize("error", [
    ValueError("bad\x00byte"), ValueError("half a pair: \ud800"), Unprintable(),
], ids=["nul", "surrogate", "unprintable"])
async def test_an_error_with_an_unstorable_message_is_recorded(
    pool: asyncpg.Pool, error: Exception,
) -> None:
    async def fail() -> None:
        raise error

    row = await run_failing_once(pool, fail)
    assert row["last_error"].startswith(type(error).__name__), row["last_error"]
