"""The ledger answers an attempt's end in the words it was given
(``wire.Finished``, fencegate_finish_effect): the end recorded, or ``gone``
once the attempt no longer holds the key. One word from the provider's
answer to the ledger's record: nothing translates between them."""

from __future__ import annotations

from typing import get_args

import asyncpg

from gateway.ledger import Ledger, new_attempt
from gateway.wire import AttemptEnd, Finished
from leases import LeaseClient
from tests.support.vocabulary import words

FINISH = ("SELECT fencegate_finish_effect('agents', $1, $2, 'run:e', $3, $4, '{}', 'ok', "
          "'summary')")


async def test_each_end_is_answered_by_its_own_name_then_gone(pool: asyncpg.Pool) -> None:
    lease = await LeaseClient(pool=pool, owner="worker").claim("run:e", ttl=120)
    assert lease is not None
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10))
    for end in get_args(AttemptEnd):
        attempt = new_attempt()
        admission = await ledger.admit("agents", end, end.encode(), "run:e", lease.fence,
                                       "hook", attempt, 60.0, 0.0)
        assert admission.verdict == "admitted"
        status = 200 if end in ("succeeded", "failed") else None
        answer = await pool.fetchval(FINISH, end, attempt, end, status)
        assert answer == end and answer in words(Finished)
        assert await pool.fetchval(FINISH, end, attempt, end, status) == "gone", end
    # the unknown one holds its place in the drain barrier until its deadline
    assert await pool.fetchval("SELECT inflight FROM fencegate_leases") == 1
