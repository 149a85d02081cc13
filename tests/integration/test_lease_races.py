"""Claim races on one resource: real concurrent connections, and real processes."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import multiprocessing
import multiprocessing.synchronize
import time

import asyncpg

from leases import LeaseClient
from tests.support.waiting import GENEROUS_SECONDS

ROUNDS = 300
CLAIMERS = 16


async def test_concurrent_claims_have_exactly_one_winner_per_round(pool: asyncpg.Pool) -> None:
    clients = [LeaseClient(pool=pool, owner=f"w{i}") for i in range(CLAIMERS)]
    fences: list[int] = []
    for _ in range(ROUNDS):
        results = await asyncio.gather(*(c.claim("run:race", ttl=30) for c in clients))
        winners = [lease for lease in results if lease is not None]
        assert len(winners) == 1, f"{len(winners)} winners in one round"
        fences.append(winners[0].fence)
        assert await winners[0].release() is True
    assert all(b > a for a, b in itertools.pairwise(fences))


TTL = 0.05
RUN_SECONDS = 3.0


def _claim_loop(dsn: str, owner: str, start: multiprocessing.synchronize.Barrier,
                out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def main() -> list[tuple[int, str, float]]:
        wins = []
        conn = await asyncpg.connect(dsn)
        pool_client = LeaseClient(dsn, owner=owner, pool_size=1)
        try:
            await pool_client.connect()
            # every child has imported and connected: they start together
            await asyncio.to_thread(start.wait, GENEROUS_SECONDS)
            end = time.monotonic() + RUN_SECONDS
            while time.monotonic() < end:
                lease = await pool_client.claim("run:procs", ttl=TTL)
                if lease is not None:
                    wins.append((lease.fence, owner, lease.expires_at.timestamp()))
                    await asyncio.sleep(TTL * 1.5)  # let it lapse: the others race for it
        finally:
            await pool_client.close()
            await conn.close()
        return wins

    out.put(asyncio.run(main()))


def test_processes_racing_for_one_resource_never_hold_it_together(dsn: str) -> None:
    """Four OS processes claim one short lease as fast as they can. By the
    database clock, each win starts no earlier than the previous holder's
    expiry (unless it is the same owner re-claiming), and fences only rise."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Barrier(4)
    procs = [ctx.Process(target=_claim_loop, args=(dsn, f"p{i}", start, out))
             for i in range(4)]
    for p in procs:
        p.start()
    wins = [w for _ in procs for w in out.get(timeout=2 * GENEROUS_SECONDS)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    wins.sort()
    assert len(wins) > 20, "too few wins to say anything"
    assert len({w[1] for w in wins}) > 1, "one process won every time: no race happened"
    assert len({w[0] for w in wins}) == len(wins), "a fence was issued twice"
    for (f1, o1, exp1), (f2, o2, exp2) in itertools.pairwise(wins):
        claimed_at = exp2 - TTL
        if o1 != o2:
            assert claimed_at >= exp1 - 1e-6, (
                f"{o2} claimed (fence {f2}) while {o1}'s lease (fence {f1}) was live until "
                f"{dt.datetime.fromtimestamp(exp1)}"
            )
        assert exp2 >= exp1  # later fences were granted later
