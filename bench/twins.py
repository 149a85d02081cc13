"""Single-item twins: is a statement of one call faster than the batched
statement carrying that one call?

The batchers (leases/batch.py) send whatever gathered as one batched
statement (``claim_leases``, ``release_leases``, ``admit_effects``,
``finish_effects``). Each also has a single-call statement (``claim_lease``
...), which a batch of one could use instead. This times both, on one
pooled connection through ``Database`` as the code runs them, the same
calls in the same run: blocks of ``BLOCK`` calls, alternating which of the
two goes first, ``ROUNDS`` times, so a drift of the machine falls on both.
Each call does the work the code's does (a claim of a resource of its own,
the release of a live lease, the admission of a key of its own under a live
lease, the end of one admitted attempt).

    .venv/bin/python -m bench.twins            (FENCEGATE_DATABASE_URL, or the embedded server)

Prints a markdown table: the median and mean of each, in microseconds, the
single statement's median saving over the batched one, and in how many of
the blocks (the median of each block against the other's same block) the
single one was the faster.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from leases import Database, database

from . import harness

DB = "fencegate_bench_twins"
#: calls per block, and blocks per variant
BLOCK = int(os.environ.get("TWINS_BLOCK", "250"))
ROUNDS = int(os.environ.get("TWINS_ROUNDS", "12"))
N = BLOCK * ROUNDS
LOCK_WAIT = 0.25  # leases/client.py LOCK_WAIT_SECONDS
MARGIN = 5.0  # gateway/ledger.py RESEND_MARGIN_SECONDS

Call = Callable[[int], Awaitable[Any]]


async def _time(single: Call, batched: Call) -> tuple[list[float], list[float]]:
    """Each call's time in µs: ``single(i)`` and ``batched(i)`` for i < N, in
    alternating blocks."""
    times: dict[str, list[float]] = {"single": [], "batched": []}
    calls = {"single": single, "batched": batched}
    for r in range(ROUNDS):
        order = ("single", "batched") if r % 2 == 0 else ("batched", "single")
        for name in order:
            for i in range(r * BLOCK, (r + 1) * BLOCK):
                started = time.perf_counter()
                await calls[name](i)
                times[name].append((time.perf_counter() - started) * 1e6)
    return times["single"], times["batched"]


def _nonce(variant: str, i: int) -> int:
    """The attempt nonce of call ``i`` of a variant (never the warm-up's 1)."""
    return (1 if variant == "s" else 2) * 10**7 + i


def _columns(args: tuple[Any, ...]) -> list[list[Any]]:
    return [[a] for a in args]


async def measure(dsn: str) -> list[tuple[str, list[float], list[float]]]:
    pool = await database.create_pool(dsn, min_size=1, max_size=1)
    db = Database(pool=pool)
    found = []
    try:
        for _ in range(50):  # prepared and cached, as a running process has them
            await db.fetchval("finish_effect", "warm", "warm", 1, "warm", "free", None, None,
                              None, None, False)

        # claims: a resource of its own each, which the releases below end
        async def claim_single(i: int) -> Any:
            row = await db.fetchrow("claim_lease", f"twin:s:{i}", "bench", 600.0)
            assert row is not None
            return row

        async def claim_batched(i: int) -> Any:
            rows = await db.fetch("claim_leases", [f"twin:b:{i}"], ["bench"], [600.0])
            row = {r["ord"]: r for r in rows}.get(1)
            assert row is not None
            return row

        found.append(("claim: `claim_lease` / `claim_leases`",
                      *await _time(claim_single, claim_batched)))
        fences = {r["resource"]: r["fence"] for r in await db.fetch(
            "claim_leases", [f"twin:{v}:{i}" for v in "sb" for i in range(N)],
            ["bench"] * 2 * N, [600.0] * 2 * N)}

        async def release_single(i: int) -> Any:
            r = f"twin:s:{i}"
            row = await db.fetchrow("release_lease", r, "bench", fences[r], LOCK_WAIT)
            assert row is not None
            return row

        async def release_batched(i: int) -> Any:
            r = f"twin:b:{i}"
            rows = await db.fetch("release_leases", [r], ["bench"], [fences[r]], LOCK_WAIT)
            assert 1 in {r["ord"] for r in rows}

        found.append(("release: `release_lease` / `release_leases`",
                      *await _time(release_single, release_batched)))

        # admissions: a key of its own each, under one live lease per variant
        leases = {v: await db.fetchrow("claim_lease", f"twin:effects:{v}", "bench", 3600.0)
                  for v in "sb"}

        def admit_args(v: str, i: int) -> tuple[Any, ...]:
            lease = leases[v]
            assert lease is not None
            return ("bench", f"{v}-{i}", b"fp", lease["resource"], lease["fence"], "hook",
                    _nonce(v, i), 60.0, 0.0)

        async def admit_single(i: int) -> Any:
            row = await db.fetchrow("admit_effect", *admit_args("s", i), MARGIN, None)
            assert row is not None and row["verdict"] == "admitted", row
            return row

        async def admit_batched(i: int) -> Any:
            rows = await db.fetch("admit_effects", *_columns(admit_args("b", i)), MARGIN,
                                  [None])
            row = {r["ord"]: r for r in rows}[1]
            assert row["verdict"] == "admitted", row
            return row

        found.append(("admission: `admit_effect` / `admit_effects`",
                      *await _time(admit_single, admit_batched)))

        # the ends of those attempts, as the outcome writer records a 200
        def finish_args(v: str, i: int) -> tuple[Any, ...]:
            lease = leases[v]
            assert lease is not None
            return ("bench", f"{v}-{i}", _nonce(v, i), lease["resource"], "succeeded", 200,
                    '{"Content-Type": "text/plain"}', b"ok", "http 200", False)

        async def finish_single(i: int) -> Any:
            done = await db.fetchval("finish_effect", *finish_args("s", i))
            assert done == "recorded", done
            return done

        async def finish_batched(i: int) -> Any:
            rows = await db.fetch("finish_effects", *_columns(finish_args("b", i)))
            done = {r["ord"]: r["done"] for r in rows}[1]
            assert done == "recorded", done
            return done

        found.append(("outcome: `finish_effect` / `finish_effects`",
                      *await _time(finish_single, finish_batched)))
    finally:
        await pool.close()
    return found


async def main() -> None:
    server_dsn = os.environ.get(database.DATABASE_URL_ENV) or database.start_embedded()
    dsn = await harness.fresh_database(server_dsn, DB)
    conn = await asyncpg.connect(dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        sync = await conn.fetchval("SHOW synchronous_commit")
        fsync = await conn.fetchval("SHOW fsync")
    finally:
        await conn.close()
    found = await measure(dsn)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, PostgreSQL {version} "
          f"(fsync {fsync}, synchronous_commit {sync}), {os.cpu_count()} CPUs, "
          f"{N:,} calls of each, blocks of {BLOCK} alternating; µs per call\n")
    print("| statement (single / batched of one) | single p50 | batched p50 | single mean "
          "| batched mean | single saves (p50) | blocks where single is faster |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, single, batched in found:
        s50, b50 = statistics.median(single), statistics.median(batched)
        faster = sum(statistics.median(single[r * BLOCK:(r + 1) * BLOCK])
                     < statistics.median(batched[r * BLOCK:(r + 1) * BLOCK])
                     for r in range(ROUNDS))
        print(f"| {name} | {s50:.0f} | {b50:.0f} | {statistics.fmean(single):.0f} "
              f"| {statistics.fmean(batched):.0f} | {b50 - s50:+.0f} µs "
              f"({(b50 - s50) / b50:+.1%}) | {faster} of {ROUNDS} |")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(__doc__)
    import uvloop

    uvloop.run(main())  # as a production process runs (docs/leases.md)
