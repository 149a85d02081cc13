"""A handler's result is a reference (``result_ref``: a key, a URL, an id),
stored in the job's row: at most ``MAX_RESULT_BYTES`` (1 MiB) of UTF-8. A
larger one is refused before it is sent, and fails only its own job with
that reason; the jobs completed beside it in the same statement count."""

from __future__ import annotations

import asyncpg
import pytest

from leases.completion import MAX_RESULT_BYTES, unstorable
from tests.support.working import run_four


@pytest.mark.parametrize("result", [
    "x" * (MAX_RESULT_BYTES + 1),
    "é" * (MAX_RESULT_BYTES // 2 + 1),  # fewer characters than the bound, more bytes
    "x" * (30 * 1024 * 1024),  # tens of MB
], ids=["just-over", "multibyte", "30MB"])
async def test_a_result_over_the_bound_fails_only_its_own_job(
    pool: asyncpg.Pool, result: str,
) -> None:
    rows = await run_four(pool, result, max_attempts=2)
    assert (rows[0]["state"], rows[0]["attempts"], rows[0]["size"]) == ("dead", 2, None)
    assert "its result could not be stored" in rows[0]["last_error"]
    assert "1 MiB" in rows[0]["last_error"], rows[0]["last_error"]


async def test_a_result_at_the_bound_is_stored(pool: asyncpg.Pool) -> None:
    rows = await run_four(pool, "é" * (MAX_RESULT_BYTES // 2), max_attempts=2)
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
