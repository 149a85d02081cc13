"""Two admission statements that cross on the same keys.

Each batch skips the lease rows held elsewhere, so batches never wait on
each other's lease rows; they can wait on each other's idempotency keys.
Batch A admits K on R1 and J on R3; batch B (another gateway process)
admits J on R2 and K on R4. Batches take their keys in key order, so both
want J first and one waits for the other (test_effect_lock_order.py); every
caller gets a verdict, never 500, and each key is admitted once.
"""

from __future__ import annotations

import asyncio

import asyncpg

from gateway.ledger import Ledger, new_attempt
from leases import LeaseClient
from tests.support.crossing import claim_fences, hold_inserts, holding
from tests.support.locks import until_waiting


async def test_batches_that_cross_on_their_keys_answer_every_caller(
    pool: asyncpg.Pool,
) -> None:
    fences = await claim_fences(pool, "run:1", "run:2", "run:3", "run:4")
    # each batch's first insert waits, so both hold their first key before
    # either reaches its second: the crossing, every time
    await hold_inserts(pool, [("K", "run:1"), ("J", "run:2")])
    a = Ledger(LeaseClient(pool=pool, owner="gateway-a", timeout=10))
    b = Ledger(LeaseClient(pool=pool, owner="gateway-b", timeout=10))

    def admit(ledger: Ledger, key: str, resource: str) -> asyncio.Future[object]:
        return asyncio.ensure_future(ledger.admit(
            "agents", key, key.encode(), resource, fences[resource], "hook", new_attempt(),
            5.0, 0.0))

    async with holding(pool):
        calls = [admit(a, "K", "run:1"), admit(a, "J", "run:3"),
                 admit(b, "J", "run:2"), admit(b, "K", "run:4")]
        await until_waiting(pool, "fencegate_admit_effects", 2)
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    verdicts = [r.verdict for r in results]  # type: ignore[union-attr]
    # each key admitted once; its other caller told so (in progress, or a key
    # reused on another resource), never a second admission
    assert sorted(verdicts).count("admitted") == 2, verdicts
    rows = await pool.fetch("SELECT idempotency_key, state FROM fencegate_effects")
    assert sorted(tuple(r) for r in rows) == [("J", "in_flight"), ("K", "in_flight")]
    await a.drain()
    await b.drain()
