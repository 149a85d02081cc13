"""A set-based admission batch (fencegate_admit_effects, keys all new) whose
key another transaction inserts first, still uncommitted: the batch waits
on that key (its INSERT ... ON CONFLICT), and then answers as the loop of
single admissions does. If the other commits, the batch undoes its inserts
and takes the loop (the key is reused under another resource; the batch's
other keys are admitted once, counted once); if the other rolls back, the
set-based path admits them all."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from gateway.ledger import new_attempt
from tests.support.crossing import claim_fences
from tests.support.locks import until_waiting

ADMIT_BATCH = ("SELECT ord, verdict, effect_id IS NOT NULL AS has_id "
               "FROM fencegate_admit_effects($1::text[], $2::text[], $3::bytea[], "
               "$4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::float8[], "
               "$9::float8[], $10::float8, $11::jsonb[])")
ADMIT_ONE = ("SELECT verdict FROM fencegate_admit_effect($1, $2, $3, $4, $5, 'hook', "
             "$6::bigint, 60, 0, 30, NULL)")


async def _race(pool: asyncpg.Pool, commit: bool) -> tuple[list[Any], list[Any]]:
    fences = await claim_fences(pool, "run:1", "run:2", "run:3")
    entries = [["agents", key, key.encode(), r, fences[r], "hook", new_attempt(), 60.0, 0.0,
                None] for key, r in (("K", "run:2"), ("J", "run:3"), ("A", "run:3"))]
    columns = [list(c) for c in zip(*entries, strict=True)]
    async with pool.acquire() as other:
        tx = other.transaction()
        await tx.start()
        assert await other.fetchval(ADMIT_ONE, "agents", "K", b"K", "run:1",
                                    fences["run:1"], new_attempt()) == "admitted"
        batch = asyncio.ensure_future(pool.fetch(ADMIT_BATCH, *columns[:9], 30.0,
                                                 columns[9]))
        await until_waiting(pool, "fencegate_admit_effects")
        await (tx.commit() if commit else tx.rollback())
    answers = sorted(tuple(r) for r in await batch)
    leases = await pool.fetch("SELECT resource, inflight FROM fencegate_leases ORDER BY 1")
    return answers, [tuple(r) for r in leases]


@pytest.mark.parametrize("commit", [True, False])
async def test_a_key_inserted_meanwhile_is_answered_as_the_loop_does(
    pool: asyncpg.Pool, commit: bool,
) -> None:
    answers, leases = await _race(pool, commit)
    first = "idempotency_key_reused" if commit else "admitted"
    assert answers == [(1, first, True), (2, "admitted", True), (3, "admitted", True)]
    assert leases == [("run:1", 1 if commit else 0), ("run:2", 0 if commit else 1),
                      ("run:3", 2)]
    keys = await pool.fetch("SELECT idempotency_key, resource FROM fencegate_effects "
                            "ORDER BY 1")
    assert [tuple(r) for r in keys] == [("A", "run:3"), ("J", "run:3"),
                                        ("K", "run:1" if commit else "run:2")]
