"""Moving the database's clock for a test instead of waiting it out: a lease
that runs out now, as if its ttl had passed, rather than a short ttl and a
sleep that a loaded machine may stretch past anything else the test expects."""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg

from leases import Queue


async def lapse(pool: asyncpg.Pool | asyncpg.Connection, *resources: str,
                after: Iterable[Queue] = ()) -> None:
    """Let the live leases on ``resources`` (all of them, if none is named)
    run out now, as if their ttl had passed: the holder stalled or died. The
    fence and the drain barrier stay as they are.

    ``after``: queues that have claimed. A queue's claim may start a look for
    expired claims in the background (its first claim always does); that look
    ends first, or it could find these leases lapsed and recover their jobs
    before the test meant anyone to."""
    for queue in after:
        if queue._recovering is not None:
            await queue._recovering
    await pool.execute(
        "UPDATE fencegate_leases SET expires_at = clock_timestamp() "
        "WHERE expires_at > clock_timestamp() "
        "AND (cardinality($1::text[]) = 0 OR resource = ANY($1::text[]))", list(resources))
