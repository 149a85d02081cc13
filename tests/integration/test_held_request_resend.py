"""Issue 21's held-request wait across attempts of one key: "not sent" waits
``HELD_REQUEST_SECONDS`` after an attempt whose whole request may have
reached the provider's host, whichever attempt that was."""

from __future__ import annotations

import asyncpg

from gateway.ledger import HELD_REQUEST_SECONDS, RESOLVE_GRACE_SECONDS, Ledger, new_attempt
from leases import Database

CLIENT, KEY, RESOURCE = "agents", "k-again", "run:held"


async def _admit(ledger: Ledger, attempt: int) -> str:
    admission = await ledger.admit(CLIENT, KEY, b"fp", RESOURCE, 1, "crm", attempt, 5.0,
                                   86400.0)
    return admission.verdict


async def _end_unknown(ledger: Ledger, attempt: int, never_whole: bool) -> None:
    ledger.finish(CLIENT, KEY, attempt, RESOURCE, "unknown", None, "http timeout",
                  never_whole=never_whole)
    await ledger.settled(CLIENT, KEY)


async def test_a_later_attempt_that_may_have_left_whole_holds_not_sent_back(
        pool: asyncpg.Pool) -> None:
    """The first attempt was cut before its request left whole (never whole:
    "not sent" at once would be safe). The key is repeated inside the
    provider's window, so it is admitted and sent again, whole this time, and
    that attempt too gets no answer. Its request may sit whole at the
    provider: "not sent" must wait the held-request window. The ledger kept
    the first attempt's "never whole" for the key (request_whole only ever
    went from true to false), so the second attempt was resolvable at once."""
    await pool.execute(
        "INSERT INTO fencegate_leases (resource, owner, fence, claimed_at, expires_at) "
        "VALUES ($1, 'w', 1, clock_timestamp(), clock_timestamp() + interval '1 hour')",
        RESOURCE)
    ledger = Ledger(Database(pool=pool, timeout=10.0))
    first, second = new_attempt(), new_attempt()
    assert await _admit(ledger, first) == "admitted"
    await _end_unknown(ledger, first, never_whole=True)
    await pool.execute("UPDATE fencegate_effects SET deadline = clock_timestamp()")
    assert await _admit(ledger, second) == "admitted"  # sent again, inside the window
    await _end_unknown(ledger, second, never_whole=False)
    # the second attempt is over, and its grace too: "sent" may be resolved,
    # but not yet "not sent" (the held window has far to go)
    passed = RESOLVE_GRACE_SECONDS + 5
    assert passed < HELD_REQUEST_SECONDS
    await pool.execute("UPDATE fencegate_effects SET deadline = clock_timestamp() - "
                       "make_interval(secs => $1)", passed)
    assert not await ledger.resolve(CLIENT, KEY, "not_sent", operator="ops")
    why = await ledger.why_unresolved(CLIENT, KEY, "not_sent")
    assert why.code == "effect_in_progress" and "whole request" in why.detail, why
    assert await ledger.resolve(CLIENT, KEY, "sent", operator="ops")
    await ledger.drain()
