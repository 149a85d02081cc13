"""Section 8: what the fence check costs a transaction in the caller's own
database (issue 26): ``BEGIN; SELECT fencegate_check_fence(resource, fence);
UPDATE one row; COMMIT`` against the same transaction without the check, in
the same run, at 1 and 8 clients.

Two clients: pgbench (``-M prepared``, one script per variant, the embedded
server's own pgbench as in section 1), and asyncpg from Python, where the
fenced variant is ``async with lease.transaction(conn)`` (the check, and the
local lease check before COMMIT) and the plain one ``async with
conn.transaction()``. Each client writes accounts picked at random among
``ACCOUNTS``, each with its own live lease. The two variants alternate,
``REPEATS`` phases each, and each figure is the median of its phases, so a
drift of the shared machine falls on both.
"""

from __future__ import annotations

import asyncio
import random
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import asyncpg

from leases import Lease, LeaseClient, database

from .harness import SECONDS, WARMUP_SECONDS, say

CONCURRENCY = (1, 8)
ACCOUNTS = 1000
REPEATS = 3
#: one account per lease. pgbench's: resource bench.acct.<id> under fence <id>,
#: set here, as pgbench has no per-client state to keep a claimed fence in (and
#: no colon in the name: pgbench reads ":name" as a variable even in a string)
SETUP = f"""
DROP TABLE IF EXISTS bench_accounts;
CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
INSERT INTO bench_accounts (id) SELECT g FROM generate_series(1, {ACCOUNTS}) g;
DELETE FROM fencegate_leases WHERE resource LIKE 'bench.acct.%' OR resource LIKE 'bench:py:%';
INSERT INTO fencegate_leases (resource, owner, fence, claimed_at, expires_at)
SELECT 'bench.acct.' || g, 'bench', g, clock_timestamp(), clock_timestamp() + interval '1 day'
  FROM generate_series(1, {ACCOUNTS}) g;
"""
UPDATE = "UPDATE bench_accounts SET balance = balance + 1 WHERE id = $1"
SCRIPTS = {
    "plain": f"""\\set r random(1, {ACCOUNTS})
BEGIN;
UPDATE bench_accounts SET balance = balance + 1 WHERE id = :r;
COMMIT;
""",
    "fenced": f"""\\set r random(1, {ACCOUNTS})
BEGIN;
SELECT fencegate_check_fence('bench.acct.' || :r, :r);
UPDATE bench_accounts SET balance = balance + 1 WHERE id = :r;
COMMIT;
""",
}


def pgbench(dsn: str, variant: str, clients: int) -> float:
    from .run import pgbench_binary

    script = Path(tempfile.mkdtemp()) / f"{variant}.sql"
    script.write_text(SCRIPTS[variant])
    out = subprocess.run([pgbench_binary(), "-n", "-M", "prepared", "-c", str(clients),
                          "-j", str(min(clients, 2)), "-T", str(max(1, round(SECONDS))), "-f",
                          str(script), dsn], capture_output=True, text=True)
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
    assert out.returncode == 0 and m, out.stdout + out.stderr
    return float(m.group(1))


async def asyncpg_rate(dsn: str, leases: list[Lease], variant: str, clients: int) -> float:
    """Transactions a second from ``clients`` connections, each a closed loop."""
    conns = [await asyncpg.connect(dsn) for _ in range(clients)]
    rng = random.Random(clients)
    count = 0

    async def loop(conn: asyncpg.Connection, until: float, counted: bool) -> None:
        nonlocal count
        while time.perf_counter() < until:
            lease = leases[rng.randrange(ACCOUNTS)]
            account = int(lease.resource.rsplit(":", 1)[1])
            block = lease.transaction(conn) if variant == "fenced" else conn.transaction()
            async with block:
                await conn.execute(UPDATE, account)
            count += counted

    try:
        warm = time.perf_counter() + WARMUP_SECONDS
        await asyncio.gather(*(loop(c, warm, False) for c in conns))
        started = time.perf_counter()
        await asyncio.gather(*(loop(c, started + SECONDS, True) for c in conns))
        return count / (time.perf_counter() - started)
    finally:
        for c in conns:
            await c.close()


async def bench_fenced(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SETUP)
    finally:
        await conn.close()
    # the Python side claims leases of its own on the same accounts, as a worker would
    pool = await database.create_pool(dsn, min_size=1, max_size=4)
    client = LeaseClient(pool=pool, owner="bench")
    leases = [lease for i in range(1, ACCOUNTS + 1)
              if (lease := await client.claim(f"bench:py:{i}", ttl=3600)) is not None]
    assert len(leases) == ACCOUNTS
    rows = []
    for clients in CONCURRENCY:
        for name in ("pgbench", "asyncpg"):
            phases: dict[str, list[float]] = {"plain": [], "fenced": []}
            for _ in range(REPEATS):
                for variant in ("plain", "fenced"):
                    if name == "pgbench":
                        rate = await asyncio.to_thread(pgbench, dsn, variant, clients)
                    else:
                        rate = await asyncpg_rate(dsn, leases, variant, clients)
                    phases[variant].append(rate)
            plain, fenced = (statistics.median(phases[v]) for v in ("plain", "fenced"))
            rows.append((clients, name, plain, fenced))
    await pool.close()
    say("## 8. Fenced transaction in the caller's database: the cost of the check\n")
    say("`BEGIN; SELECT fencegate_check_fence(resource, fence); UPDATE bench_accounts SET "
        "balance = balance + 1 WHERE id = $1; COMMIT` against the same transaction without "
        f"the check, {ACCOUNTS} accounts "
        "each with its own live lease, picked at random. pgbench: `-M prepared`, one script "
        "per variant. asyncpg: `async with lease.transaction(conn)` (the check, and the "
        "local lease check before COMMIT) against `async with conn.transaction()`. "
        f"Median of {REPEATS} alternating {SECONDS:g}s phases of each variant "
        "(bench/fenced_tx.py).\n")
    say("| clients | client | without the check (tx/s) | fenced (tx/s) | ratio | "
        "added per transaction (ms) |")
    say("| ---: | --- | ---: | ---: | ---: | ---: |")
    for clients, name, plain, fenced in rows:
        added = (1 / fenced - 1 / plain) * 1000 * clients
        say(f"| {clients} | {name} | {plain:,.0f} | {fenced:,.0f} | {fenced / plain:.2f}x | "
            f"{added:+.3f} |")
    say()

