"""fencegate benchmarks: every figure is a ratio against a baseline measured in
the same run, on the same machine. ``make bench`` runs this and writes
``bench/RESULTS.md`` and the charts it links to (bench/charts/).

Processes: PostgreSQL (embedded, or FENCEGATE_DATABASE_URL), the peers
(bench/peers.py), the gateway (``fencegate serve``), and a load generator in a
process of its own (bench/loadgen.py), pinned to the last CPU so it cannot
crowd the gateway off the first; everything else is left to the scheduler. On
a 2-core machine the load generator, the gateway, the peer and PostgreSQL
share two cores: the absolute numbers are low, the ratios are what to read.

    python -m bench.run                   every section, then RESULTS.md and charts/
    python -m bench.run http scaling      some sections (charts into a temporary
                                          folder, or BENCH_CHARTS; RESULTS.md untouched)
    python -m bench.run flame             a py-spy flame graph (bench/flame.py)

Sections: claims, http, email, queue, rt, overload, scaling, fenced. BENCH_SECONDS sets
the length of each timed phase (default 5), BENCH_WARMUP the warm-up before
each (default 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import platform
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from prometheus_client import REGISTRY

from leases import LeaseClient, NewJob, Queue, Worker, database
from leases.queue import Job

from . import charts, fenced_tx, scaling, statements
from .cpu import CpuMeter
from .harness import (
    API_KEY,
    OUT,
    RESOURCES,
    ROOT,
    SECONDS,
    free_port,
    fresh_database,
    gateway,
    peer,
    postmaster_pid,
    say,
    wait_port,
    xact_count,
)
from .loadgen import run_load

SECTIONS = ("claims", "http", "email", "queue", "rt", "overload", "scaling", "fenced")
#: what the charts say under their titles: when, where, how long each phase
SUBTITLE: list[str] = []


def subtitle() -> str:
    return SUBTITLE[0] if SUBTITLE else ""


# ---- 1. lease claims ----------------------------------------------------------

CLAIM_SQL = """\\set r random(1, 1000000)
INSERT INTO fencegate_leases AS l (resource, owner, fence, claimed_at, expires_at)
VALUES ('bench:' || :r, 'pgbench', fencegate_next_fence(0), clock_timestamp(),
        clock_timestamp() + make_interval(secs => 60))
ON CONFLICT (resource) DO UPDATE
   SET owner = excluded.owner, fence = fencegate_next_fence(l.fence),
       claimed_at = clock_timestamp(), expires_at = clock_timestamp() + make_interval(secs => 60),
       inflight = 0, drain_until = NULL
 WHERE (l.expires_at <= clock_timestamp() OR l.owner = excluded.owner)
   AND (l.inflight = 0 OR l.drain_until <= clock_timestamp())
RETURNING resource, owner, fence, expires_at;
"""
CLAIM_CONCURRENCY = (1, 4, 8, 16, 32, 64)


def pgbench_binary() -> str:
    return str(database.embedded_bin_dir() / "pgbench")  # the embedded server's own


def pgbench(dsn: str, clients: int) -> tuple[float, float]:
    """pgbench's claims/s, and the CPU seconds its process spent."""
    script = Path(tempfile.mkdtemp()) / "claim.sql"
    script.write_text(CLAIM_SQL)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # pgbench is the one child reaped
    out = subprocess.run([pgbench_binary(), "-n", "-M", "prepared", "-c", str(clients),
                          "-j", str(min(clients, 2)), "-T", str(max(1, round(SECONDS))), "-f",
                          str(script), dsn], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
    assert m, out.stdout
    return float(m.group(1)), (after.ru_utime + after.ru_stime) - (before.ru_utime +
                                                                   before.ru_stime)


async def claim_rate(dsn: str, clients: int) -> tuple[float, float, int]:
    """LeaseClient's claims/s, the CPU seconds this process spent on them
    (the client, its pool, asyncpg, the event loop), and the claims made."""
    pool = await database.create_pool(dsn, min_size=clients, max_size=clients)
    client = LeaseClient(pool=pool, owner="bench")
    rng = random.Random(1)
    count = 0
    end = time.perf_counter() + SECONDS

    async def claimer() -> None:
        nonlocal count
        while time.perf_counter() < end:
            await client.claim(f"bench:{rng.randint(1, 1_000_000)}", ttl=60)
            count += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(claimer() for _ in range(clients)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await pool.close()
    return count / elapsed, cpu, count


async def asyncpg_rate(dsn: str, clients: int) -> float:
    """The claims/s of asyncpg alone, without LeaseClient: the same statement
    as pgbench's, prepared, each client on a connection of its own, one
    claim after another: what Python and the driver cost by themselves."""
    pool = await database.create_pool(dsn, min_size=clients, max_size=clients)
    statement = CLAIM_SQL.split("\n", 1)[1].replace(":r", "$1::int")
    rng = random.Random(2)
    count = 0
    end = time.perf_counter() + SECONDS

    async def claimer() -> None:
        nonlocal count
        async with pool.acquire() as conn:
            prepared = await conn.prepare(statement)
            while time.perf_counter() < end:
                await prepared.fetch(rng.randint(1, 1_000_000))
                count += 1

    started = time.perf_counter()
    await asyncio.gather(*(claimer() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    await pool.close()
    return count / elapsed


async def bench_claims(dsn: str) -> None:
    say("## 1. Lease claims: `LeaseClient.claim` against raw pgbench, same statement\n")
    say("CPU: milliseconds per claim of the client's process (pgbench's, or this Python "
        "process running LeaseClient on its pool) and of PostgreSQL's process tree, over "
        "each run. The two share the machine's two cores.\n")
    say("asyncpg alone: pgbench's statement, prepared, from this Python process, each "
        "client on a connection of its own, without LeaseClient.\n")
    say("| concurrency | pgbench (claims/s) | LeaseClient (claims/s) | ratio "
        "| asyncpg alone (claims/s) | its ratio to pgbench "
        "| client CPU ms: pgbench | LeaseClient | PostgreSQL CPU ms: pgbench | LeaseClient |")
    say("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    pg = await postmaster_pid(dsn)
    meter = CpuMeter({"PostgreSQL": [pg]} if pg else {})

    async def server_ms(claims: float) -> str:
        await asyncio.sleep(0.2)  # the postmaster reaps the closed connections' backends
        s = meter.stop()
        if "PostgreSQL" not in s.groups or not claims:
            return "n/a"
        return f"{s.groups['PostgreSQL'] * s.seconds * s.cpus * 1000 / claims:.3f}"

    rows = []
    for clients in CLAIM_CONCURRENCY:
        meter.start()
        base, base_cpu = await asyncio.to_thread(pgbench, dsn, clients)
        base_pg = await server_ms(base * SECONDS)  # pgbench runs -T SECONDS
        meter.start()
        ours, our_cpu, made = await claim_rate(dsn, clients)
        our_pg = await server_ms(made)
        alone = await asyncpg_rate(dsn, clients)
        rows.append((clients, base, ours))
        say(f"| {clients} | {base:,.0f} | {ours:,.0f} | {ours / base:.2f}x | "
            f"{alone:,.0f} | {alone / base:.2f}x | "
            f"{base_cpu * 1000 / (base * SECONDS):.3f} | {our_cpu * 1000 / made:.3f} | "
            f"{base_pg} | {our_pg} |")
    say()
    path = charts.claims(rows, subtitle())
    say(f"![LeaseClient.claim against pgbench](charts/{path.name})\n")


# ---- 2. fenced HTTP effects ---------------------------------------------------

#: closed-loop callers of the throughput sweep; SATURATING is the table's saturation
SWEEP = (1, 4, 16, 32, 64)
#: the closed-loop concurrency that saturates one gateway process here (section 2)
SATURATING = 32
MODERATE_RATE = 200


def _http(spec: dict[str, Any], levels: tuple[int, ...], middle: int | None = None,
          pg: int | None = None) -> dict[str, Any]:
    """Moderate load (every latency kept), then each closed loop of ``levels``;
    with ``middle`` (the pid of the proxy or gateway between the callers and
    the sink), that process tree's CPU ms per request in the loop of one, and
    with ``pg`` (the postmaster's) PostgreSQL's."""
    meter = CpuMeter({"middle": [middle], **({"PostgreSQL": [pg]} if pg else {})}
                     if middle else {})
    shares: list[Any] = []

    def closed(c: int) -> dict[str, Any]:
        measured = middle is not None and c == 1
        r = run_load({"kind": "http", "concurrency": c, "run_id": f"c{c}-{time.time_ns()}",
                      **spec},
                     on_start=(lambda _pid: meter.start()) if measured else None,
                     on_end=(lambda: shares.append(meter.stop())) if measured else None)
        if measured and shares and r["n"]:
            s = shares[0]
            per = s.seconds * s.cpus * 1000 / (r["n"] + r["errors"])
            r["cpu_ms"] = s.groups["middle"] * per
            if "PostgreSQL" in s.groups:
                r["pg_ms"] = s.groups["PostgreSQL"] * per
        return r

    return {"moderate": run_load({"kind": "http", "rate": MODERATE_RATE,
                                  "keep_latencies": True, "run_id": f"m{time.time_ns()}",
                                  **spec}),
            "closed": {c: closed(c) for c in levels}}


async def bench_http(dsn: str) -> None:
    sink_port, proxy_port, smtp_port = free_port(), free_port(), free_port()
    say("## 2. Fenced HTTP effect: gateway against a direct call and a bare proxy\n")
    say(f"Moderate load: an open loop at {MODERATE_RATE} requests/s for {SECONDS:g}s. "
        f"1 caller: a closed loop of one. Saturation: a closed loop of {SATURATING} callers "
        f"for {SECONDS:g}s. Effects spread over {RESOURCES} leased resources, every request "
        "a new idempotency key. CPU per request, 1 caller: over the loop of one, "
        "milliseconds of the middle process tree (the bare proxy's, or the gateway's) and "
        "of PostgreSQL's, per request.\n")
    rows: dict[str, dict[str, Any]] = {}
    pg = await postmaster_pid(dsn)
    with peer("sink", sink_port), \
            peer("proxy", proxy_port, f"http://127.0.0.1:{sink_port}") as proxy:
        await wait_port(sink_port)
        await wait_port(proxy_port)
        rows["direct"] = _http({"url": f"http://127.0.0.1:{sink_port}/hook/x"}, SWEEP)
        rows["bare proxy"] = _http({"url": f"http://127.0.0.1:{proxy_port}/hook/x"}, SWEEP,
                                   proxy.pid)
        for workers in (1, 2):
            async with gateway(dsn, sink_port, smtp_port, workers) as gw:
                rows[f"gateway --workers {workers}"] = _http(
                    {"url": f"{gw.url}/v1/http/sink/x", "leases": gw.leases},
                    SWEEP if workers == 1 else (1, SATURATING), gw.proc.pid, pg)
    direct, bare = rows["direct"], rows["bare proxy"]
    say("| path | p50 ms (moderate) | p99 ms (moderate) | +p50 vs direct | +p99 vs direct "
        "| p50 ms (1 caller) | +p50 vs direct | CPU ms per request, 1 caller: proxy "
        "| PostgreSQL | saturation req/s | vs bare proxy | errors |")
    say("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in rows.items():
        mod, one, sat = row["moderate"], row["closed"][1], row["closed"][SATURATING]
        cpu = " | ".join(f"{one[k]:.3f}" if k in one else "n/a" for k in ("cpu_ms", "pg_ms"))
        errors = mod["errors"] + sum(r["errors"] for r in row["closed"].values())
        say(f"| {name} | {mod['p50']:.2f} | {mod['p99']:.2f} | "
            f"{mod['p50'] - direct['moderate']['p50']:+.2f} | "
            f"{mod['p99'] - direct['moderate']['p99']:+.2f} | {one['p50']:.2f} | "
            f"{one['p50'] - direct['closed'][1]['p50']:+.2f} | {cpu} | {sat['rps']:,.0f} | "
            f"{sat['rps'] / bare['closed'][SATURATING]['rps']:.2f}x | {errors} |")
    say()
    swept = {name: row for name, row in rows.items() if len(row["closed"]) == len(SWEEP)}
    gw1 = swept["gateway --workers 1"]
    say("Throughput (requests/s) against closed-loop callers:\n")
    say("| callers | " + " | ".join(swept) + " | gateway vs bare proxy |")
    say("| ---: | " + " | ".join("---:" for _ in swept) + " | ---: |")
    for c in SWEEP:
        say(f"| {c} | " + " | ".join(f"{row['closed'][c]['rps']:,.0f}"
                                     for row in swept.values()) +
            f" | {gw1['closed'][c]['rps'] / bare['closed'][c]['rps']:.2f}x |")
    say()
    path = charts.throughput({name: [(c, row["closed"][c]["rps"]) for c in SWEEP]
                              for name, row in swept.items()}, subtitle())
    say(f"![throughput against concurrency](charts/{path.name})\n")
    path = charts.latency_cdf({name: row["moderate"]["latencies"]
                               for name, row in swept.items()},
                              f"an open loop at {MODERATE_RATE} requests/s", subtitle())
    say(f"![latency distribution at moderate load](charts/{path.name})\n")


# ---- overload -------------------------------------------------------------------

async def bench_overload(dsn: str, label: str, server: str = "",
                         database_keys: str = "") -> None:
    """One gateway process, an HTTP provider that answers at once, a fresh key per
    request, at 1x, 4x and 16x the saturating concurrency: what gets through,
    how fast, and what the rest is told."""
    sink_port, smtp_port = free_port(), free_port()
    say(f"### {label}\n")
    say("| callers | 200/s | p50 ms | p99 ms | other answers |")
    say("| ---: | ---: | ---: | ---: | --- |")
    with peer("sink", sink_port), peer("smtp", smtp_port):
        await wait_port(sink_port)
        async with gateway(dsn, sink_port, smtp_port, 1, server, database_keys) as gw:
            for factor in (1, 4, 16):
                r = run_load({"kind": "http", "concurrency": SATURATING * factor,
                              "url": f"{gw.url}/v1/http/sink/x", "leases": gw.leases,
                              "run_id": f"o{factor}-{time.time_ns()}"})
                other = ", ".join(f"{n:,} {c}" for c, n in sorted(r["codes"].items())) or "none"
                say(f"| {SATURATING * factor} | {r['rps']:,.0f} | {r['p50']:.1f} | "
                    f"{r['p99']:.1f} | {other} |")
    say()


# ---- 3. email -------------------------------------------------------------------

EMAIL_BODY = {"from": "a@example.com", "to": ["b@example.com"], "subject": "bench",
              "text": "hello"}


def gateway_message() -> str:
    """The bytes the gateway sends the sink for one of section 3's emails
    (its MIME headers, Message-ID, Date and fence headers), built as it
    builds them, for the direct sender to send the same message."""
    from gateway.api import email_body
    from gateway.providers import mime
    from gateway.providers.base import EmailCall

    call = EmailCall("bench", "k1", "bench:1:0", 7, email=email_body.email_request(EMAIL_BODY))
    return mime.build_message(call, "").decode()


async def bench_email(dsn: str) -> None:
    sink_port, smtp_port = free_port(), free_port()
    say("## 3. Email: gateway against direct aiosmtplib, same aiosmtpd sink\n")
    say(f"A closed loop of 8 senders for {SECONDS:g}s each. The direct senders send a "
        "four-line message, then the message the gateway builds for the same email (its "
        "MIME, Date, Message-ID and fence headers), which the sink, an aiosmtpd server "
        "parsing each message with `email.policy.default`, reads at a cost of its own. "
        "CPU: milliseconds of each process tree per message over the timed phase.\n")
    pg = await postmaster_pid(dsn)
    roots: dict[str, list[int]] = {"PostgreSQL": [pg]} if pg else {}
    with peer("smtp", smtp_port) as sink, peer("sink", sink_port):
        await wait_port(smtp_port)
        roots["sink"] = [sink.pid]
        phases = {
            "direct, a connection per message": scaling.measured(
                {"kind": "smtp-naive", "concurrency": 8, "smtp_port": smtp_port}, roots),
            "direct, pooled connections": scaling.measured(
                {"kind": "smtp-pooled", "concurrency": 8, "smtp_port": smtp_port}, roots),
            "direct, pooled, the gateway's message": scaling.measured(
                {"kind": "smtp-pooled", "concurrency": 8, "smtp_port": smtp_port,
                 "message": gateway_message()}, roots),
        }
        async with gateway(dsn, sink_port, smtp_port, 1) as gw:
            phases["gateway (pooled, fenced, recorded)"] = ours = scaling.measured(
                {"kind": "email", "concurrency": 8, "url": f"{gw.url}/v1/email",
                 "leases": gw.leases, "body": EMAIL_BODY, "run_id": "mail"},
                {**roots, "gateway": [gw.proc.pid]})
    say("| path | messages/s | p50 ms | p99 ms | gateway vs this | CPU ms: sender "
        "| sink | gateway | PostgreSQL |")
    say("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, ph in phases.items():
        r = ph.result
        cells = " | ".join("n/a" if ph.cpu_ms(g) != ph.cpu_ms(g) else f"{ph.cpu_ms(g):.2f}"
                           for g in ("load generator", "sink", "gateway", "PostgreSQL"))
        say(f"| {name} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
            f"{ours.result['rps'] / r['rps']:.2f}x | {cells} |")
    say()


# ---- 4. the queue against Procrastinate -----------------------------------------

QUEUE_JOBS = 5000


async def fencegate_queue(dsn: str, concurrency: int, meter: CpuMeter,
                          ) -> tuple[float, float, float, str]:
    """Enqueue, then claim and complete, ``QUEUE_JOBS`` no-op jobs: the
    enqueue and the claim+complete rates, the worker's CPU ms per job (this
    process) and PostgreSQL's (``meter``'s group), over claim+complete."""
    pool = await database.create_pool(dsn, min_size=2, max_size=concurrency + 4)
    q = Queue(LeaseClient(pool=pool, owner="bench"), f"bench{concurrency}")
    started = time.perf_counter()
    for start in range(0, QUEUE_JOBS, 500):
        await q.enqueue_many([NewJob({"n": n}) for n in range(start, start + 500)])
    enqueue_rate = QUEUE_JOBS / (time.perf_counter() - started)

    async def noop(job: Job) -> None:
        return None

    # the worker's own count of the completions that counted, read in this
    # process: no statement of the benchmark's own beside the worker's
    completed = REGISTRY.get_sample_value
    labels = {"queue": q.name, "event": "completed"}
    before = completed("fencegate_jobs_total", labels) or 0.0
    worker = Worker(q, noop, concurrency=concurrency, poll_min=0.005, poll_max=0.05)
    meter.start()
    started, cpu = time.perf_counter(), time.process_time()
    task = asyncio.create_task(worker.run())
    while (completed("fencegate_jobs_total", labels) or 0.0) - before < QUEUE_JOBS:
        await asyncio.sleep(0.005)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    shares = meter.stop()
    worker.stop()
    await task
    assert (await q.stats()) == {"completed": QUEUE_JOBS}
    await pool.close()
    pg = shares.groups.get("PostgreSQL")
    pg_ms = "n/a" if pg is None else f"{pg * shares.seconds * shares.cpus * 1000 / QUEUE_JOBS:.3f}"
    return enqueue_rate, QUEUE_JOBS / elapsed, cpu * 1000 / QUEUE_JOBS, pg_ms


def procrastinate_queue(dsn: str, concurrency: int) -> tuple[float, float]:
    import logging

    import procrastinate

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    conninfo = dsn

    async def main() -> tuple[float, float]:
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=conninfo, kwargs={"autocommit": True}, min_size=2,
            max_size=concurrency + 4))

        @app.task(queue="bench", name="noop")
        async def noop(n: int) -> None:
            return None

        async with app.open_async():
            with contextlib.suppress(Exception):
                await app.schema_manager.apply_schema_async()
            started = time.perf_counter()
            for start in range(0, QUEUE_JOBS, 500):
                await noop.batch_defer_async(*({"n": n} for n in range(start, start + 500)))
            enqueue_rate = QUEUE_JOBS / (time.perf_counter() - started)
            started = time.perf_counter()
            await app.run_worker_async(queues=["bench"], concurrency=concurrency, wait=False,
                                       install_signal_handlers=False, listen_notify=False,
                                       delete_jobs="never")
            return enqueue_rate, QUEUE_JOBS / (time.perf_counter() - started)

    return asyncio.run(main())


def _procrastinate_in_process(dsn: str, concurrency: int, out: Any) -> None:
    out.put(procrastinate_queue(dsn, concurrency))


async def bench_queue(server_dsn: str) -> None:
    say("## 4. Queue: fencegate against Procrastinate, same PostgreSQL\n")
    say(f"{QUEUE_JOBS} no-op jobs, enqueued in batches of 500, then claimed and completed "
        "by one worker process at the given concurrency.\n")
    say("CPU: milliseconds per job over claim+complete, of fencegate's worker (its "
        "process) and of PostgreSQL's process tree.\n")
    say("| concurrency | Procrastinate enqueue/s | fencegate enqueue/s | ratio "
        "| Procrastinate claim+complete/s | fencegate claim+complete/s | ratio "
        "| CPU ms: worker | PostgreSQL |")
    say("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for concurrency in (1, 8, 32):
        dsn = await fresh_database(server_dsn)
        pg = await postmaster_pid(dsn)
        meter = CpuMeter({"PostgreSQL": [pg]} if pg else {})
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        p = ctx.Process(target=_procrastinate_in_process, args=(dsn, concurrency, out))
        p.start()
        p_enq, p_rate = out.get(timeout=600)
        p.join(30)
        f_enq, f_rate, worker_ms, pg_ms = await fencegate_queue(dsn, concurrency, meter)
        say(f"| {concurrency} | {p_enq:,.0f} | {f_enq:,.0f} | {f_enq / p_enq:.1f}x | "
            f"{p_rate:,.0f} | {f_rate:,.0f} | {f_rate / p_rate:.1f}x | {worker_ms:.3f} | "
            f"{pg_ms} |")
    say()


# ---- 5. round trips ----------------------------------------------------------------

async def round_trips(server_dsn: str) -> None:
    say("## 5. Database round trips, counted\n")
    say("Transactions the server committed (pg_stat_database), per effect (sent one at "
        "a time, so no two share a statement) and per job: two runs of different sizes, so "
        "connection set-up cancels out.\n")
    sink_port, smtp_port = free_port(), free_port()
    per_effect: list[float] = []
    with peer("sink", sink_port):
        await wait_port(sink_port)
        for n in (100, 600):
            dsn = await fresh_database(server_dsn)
            async with gateway(dsn, sink_port, smtp_port, 1) as gw:
                before = await xact_count(dsn)
                async with aiohttp.ClientSession() as s:
                    for i in range(n):
                        resource, fence = gw.leases[i % len(gw.leases)]
                        async with s.post(f"{gw.url}/v1/http/sink/x", json={"i": i}, headers={
                                "Authorization": f"Bearer {API_KEY}",
                                "Fence-Resource": resource, "Fence-Token": str(fence),
                                "Idempotency-Key": f"rt-{i}"}) as r:
                            assert r.status == 200
            await asyncio.sleep(1.0)  # the gateway has exited: its backends flushed
            per_effect.append(await xact_count(dsn) - before)
    effect_rt = (per_effect[1] - per_effect[0]) / 500
    per_job: list[float] = []
    for n in (200, 1200):
        dsn = await fresh_database(server_dsn)
        pool = await database.create_pool(dsn, min_size=1, max_size=4)
        q = Queue(LeaseClient(pool=pool, owner="rt"), "rt")
        await q.enqueue_many([NewJob({"n": i}) for i in range(n)])
        await pool.close()
        await asyncio.sleep(1.0)
        before = await xact_count(dsn)
        pool = await database.create_pool(dsn, min_size=1, max_size=4)
        q = Queue(LeaseClient(pool=pool, owner="rt"), "rt", recovery_interval=3600)

        async def noop(job: Job) -> None:
            return None

        worker = Worker(q, noop, concurrency=8, poll_min=0.005, poll_max=0.05,
                        backstop_interval=3600)
        task = asyncio.create_task(worker.run())
        done = 0
        while done < n:
            await asyncio.sleep(0.2)
            async with pool.acquire() as c:
                done = await c.fetchval(
                    "SELECT count(*) FROM fencegate_jobs WHERE state = 'completed'")
        worker.stop()
        await task
        await pool.close()
        await asyncio.sleep(1.0)
        per_job.append(await xact_count(dsn) - before)
    job_rt = (per_job[1] - per_job[0]) / 1000
    say("| operation | transactions (round trips) each |")
    say("| --- | ---: |")
    say(f"| one fenced HTTP effect through the gateway | {effect_rt:.2f} |")
    say(f"| one job claimed (batch of up to 8) and completed by a Worker | {job_rt:.2f} |")
    say()
    await statements.response_path(server_dsn)


def machine() -> str:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def flame_graphs() -> str:
    found = sorted(ROOT.glob("flame-*.svg"))
    if not found:
        return ""
    links = ", ".join(f"[{p.stem.removeprefix('flame-')}]({p.name})" for p in found)
    return (f"Flame graphs of the gateway at saturation (`make bench-flame`, bench/NOTES.md): "
            f"{links}.\n")


async def later_sections(sections: list[str], dsn: str, server_dsn: str) -> None:
    """Sections 6 to 8."""
    if "overload" in sections:
        say("## 6. Overload: one gateway process at 1x, 4x and 16x its saturating "
            "concurrency\n")
        await bench_overload(dsn, os.environ.get("BENCH_OVERLOAD_LABEL", "as configured"))
    if "scaling" in sections:
        await scaling.bench_scaling(await fresh_database(server_dsn), subtitle())
    if "fenced" in sections:
        await fenced_tx.bench_fenced(await fresh_database(server_dsn))


async def main(sections: list[str]) -> None:
    server_dsn = os.environ.get(database.DATABASE_URL_ENV) or database.start_embedded()
    if sections == ["flame"]:
        from .flame import flame

        await flame(server_dsn)
        return
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        sys.exit(f"no such section: {', '.join(sorted(unknown))} (sections: "
                 f"{', '.join(SECTIONS)}, or flame)")
    full = not sections
    sections = sections or list(SECTIONS)
    charts.folder(full)
    started = time.monotonic()
    dsn = await fresh_database(server_dsn)
    conn = await asyncpg.connect(server_dsn)
    pg_version = await conn.fetchval("SHOW server_version")
    await conn.close()
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    SUBTITLE.append(f"{now}, {os.cpu_count()} CPUs shared by every process, "
                    f"{SECONDS:g}s phases")
    say("# fencegate benchmarks\n")
    say(f"Run {now} on {machine()}; "
        f"PostgreSQL {pg_version}; each timed phase {SECONDS:g}s. Every ratio compares "
        "two measurements taken in this same run. Load generator: its own process, "
        "pinned to the last CPU. The Python side (LeaseClient, the queues, the load "
        "generator, the gateway) runs on uvloop.\n")
    if flame_graphs():
        say(flame_graphs())
    if "claims" in sections:
        await bench_claims(dsn)
    if "http" in sections:
        await bench_http(dsn)
    if "email" in sections:
        await bench_email(dsn)
    if "queue" in sections:
        await bench_queue(server_dsn)
    if "rt" in sections:
        await round_trips(server_dsn)
    await later_sections(sections, dsn, server_dsn)
    took = time.monotonic() - started
    print(f"the benchmark took {took / 60:.1f} minutes; charts in {charts.folder(full)}")
    if full:
        say(f"The whole run took {took / 60:.1f} minutes.\n")
        notes = ROOT / "NOTES.md"
        body = "\n".join(OUT) + ("\n" + notes.read_text() if notes.exists() else "")
        (ROOT / "RESULTS.md").write_text(body)
        print(f"wrote {ROOT / 'RESULTS.md'}")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(sys.argv[1:]))  # as a production worker would run (docs/leases.md)
