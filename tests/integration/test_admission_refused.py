"""An admission the database refuses for the moment (its statement
cancelled, past the pool's statement_timeout, a deadlock) committed
nothing: the gateway tries it alone, and if that is refused too, answers
503 ``unavailable`` (nothing was sent, retry), never 500."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from tests.integration.conftest import Gw


async def test_a_cancelled_admission_answers_unavailable(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    gw = await make_gw(database_timeout_seconds=60)  # cancelled, never timed out
    lease = await gw.leases.claim("run:refused", ttl=120)
    assert lease is not None
    cancelled: set[tuple[int, object]] = set()
    async with gw.pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM fencegate_leases WHERE resource = 'run:refused' "
                           "FOR NO KEY UPDATE")
        answer = asyncio.ensure_future(gw.post("/v1/http/hook/x", gw.headers(lease, "r"),
                                               json={"n": 1}))
        give_up = time.monotonic() + 30
        while not answer.done():  # each statement that waits for the row: the batch, alone
            assert time.monotonic() < give_up, "the admission did not wait for its lease row"
            row = await gw.pool.fetchrow(
                "SELECT pid, query_start FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' "
                "AND query LIKE '%fencegate_admit_effect%'")
            if row is not None and tuple(row) not in cancelled:
                assert await gw.pool.fetchval("SELECT pg_cancel_backend($1)", row["pid"])
                cancelled.add(tuple(row))
            await asyncio.sleep(0.01)
        status, _, body = await answer
    assert (status, body.get("code")) == (503, "unavailable"), body
    assert len(cancelled) == 2  # the batch's statement, then the one alone
    assert gw.hook.deliveries == []
    assert await gw.effect_state("r") is None  # nothing admitted
