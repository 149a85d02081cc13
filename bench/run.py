"""fencegate benchmarks: every figure is a ratio against a baseline measured in
the same run, on the same machine. ``make bench`` runs this and writes
``bench/RESULTS.md``.

Processes: PostgreSQL (embedded, or FENCEGATE_DATABASE_URL), the peers
(bench/peers.py), the gateway (``fencegate serve``), and a load generator in a
process of its own, pinned to the last CPU so it cannot crowd the gateway off
the first; everything else is left to the scheduler. On a 2-core machine the
load generator, the gateway, the peer and PostgreSQL share two cores: the
absolute numbers are low, the ratios are what to read.

BENCH_SECONDS sets the length of each timed phase (default 5).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import aiosmtplib
import asyncpg

from gateway.auth import key_sha256
from leases import LeaseClient, NewJob, Queue, Worker, database, migrate
from leases.queue import Job

SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
WARMUP_SECONDS = 1.0
DB = "fencegate_bench"
API_KEY = "bench-key"
RESOURCES = 64
ROOT = Path(__file__).resolve().parent
PY = sys.executable
OUT: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    OUT.append(line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def process(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    log = tempfile.NamedTemporaryFile(prefix="fencegate-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen(list(args), env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT.parent)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)


async def wait_port(port: int, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url + "/readyz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} never became ready")


# ---- the load generator (its own process) ----------------------------------

def _pin_last_cpu() -> None:
    with contextlib.suppress(AttributeError, OSError):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:
            os.sched_setaffinity(0, {cpus[-1]})


def loadgen(spec: dict[str, Any], out: Any) -> None:
    import uvloop

    _pin_last_cpu()
    out.put(uvloop.run(_loadgen(spec)))


async def _loadgen(spec: dict[str, Any]) -> dict[str, Any]:
    counter = iter(range(10**9))
    send = await _sender(spec["kind"], spec, counter)
    # warm up (connections, prepared statements, caches), then measure
    await _drive(send, {**spec, "seconds": WARMUP_SECONDS})
    result = await _drive(send, spec)
    await send.close()  # type: ignore[attr-defined]
    return result


async def _drive(send: _Sender, spec: dict[str, Any]) -> dict[str, Any]:
    seconds = spec["seconds"]
    latencies: list[float] = []
    errors = 0

    codes: dict[str, int] = {}

    async def one() -> None:
        nonlocal errors
        t = time.perf_counter()
        try:
            ok: bool | str = await send()
        except Exception as exc:
            ok = type(exc).__name__
        if ok is True:
            latencies.append((time.perf_counter() - t) * 1000)
        else:
            errors += 1
            code = ok if isinstance(ok, str) else "error"
            codes[code] = codes.get(code, 0) + 1

    started = time.perf_counter()
    end = started + seconds
    if spec.get("rate"):  # open loop: a fixed arrival rate, whatever the latency
        interval = 1 / spec["rate"]
        tasks = []
        next_at = started
        while next_at < end:
            tasks.append(asyncio.create_task(one()))
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.gather(*tasks)
    else:  # closed loop: N callers back to back
        async def caller() -> None:
            while time.perf_counter() < end:
                await one()
        await asyncio.gather(*(caller() for _ in range(spec["concurrency"])))
    elapsed = time.perf_counter() - started
    return {"n": len(latencies), "errors": errors, "seconds": elapsed,
            "p50": pct(latencies, 0.50), "p99": pct(latencies, 0.99),
            "rps": len(latencies) / elapsed, "codes": codes}


class _Sender:
    """Sends one request: True when it succeeded, else the problem code (or
    the status) it got."""

    def __init__(self, fn: Callable[[], Awaitable[bool | str]],
                 close: Callable[[], Awaitable[None]]) -> None:
        self._fn, self.close = fn, close

    def __call__(self) -> Awaitable[bool | str]:
        return self._fn()


async def _sender(kind: str, spec: dict[str, Any], counter: Iterator[int]) -> _Sender:
    run_id = spec.get("run_id", "r")
    if kind in ("http", "email"):
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512))
        url = spec["url"]
        leases = spec.get("leases") or []
        body = spec.get("body", {"event": "lead.updated", "id": 42})

        async def http() -> bool | str:
            i = next(counter)
            headers = {}
            if leases:
                resource, fence = leases[i % len(leases)]
                headers = {"Authorization": f"Bearer {API_KEY}", "Fence-Resource": resource,
                           "Fence-Token": str(fence), "Idempotency-Key": f"{run_id}-{i}"}
            async with session.post(url, json=body, headers=headers) as r:
                await r.read()
                return True if r.status == 200 else \
                    r.headers.get("Fencegate-Problem", str(r.status))

        return _Sender(http, session.close)
    # direct SMTP
    message = (b"From: a@example.com\r\nTo: b@example.com\r\nSubject: bench\r\n\r\nhello\r\n")
    port = spec["smtp_port"]
    if kind == "smtp-naive":
        async def naive() -> bool:
            await aiosmtplib.send(message, sender="a@example.com", recipients=["b@example.com"],
                                  hostname="127.0.0.1", port=port, start_tls=False)
            return True

        async def nothing() -> None:
            return None

        return _Sender(naive, nothing)
    pool: asyncio.Queue[aiosmtplib.SMTP] = asyncio.Queue()
    for _ in range(spec["concurrency"]):
        conn = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False)
        await conn.connect()
        pool.put_nowait(conn)

    async def pooled() -> bool:
        conn = await pool.get()
        try:
            await conn.sendmail("a@example.com", ["b@example.com"], message)
        finally:
            pool.put_nowait(conn)
        return True

    async def close_all() -> None:
        while not pool.empty():
            conn = pool.get_nowait()
            with contextlib.suppress(Exception):
                await conn.quit()

    return _Sender(pooled, close_all)


def run_load(spec: dict[str, Any]) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=loadgen, args=({"seconds": SECONDS, **spec}, out))
    p.start()
    result: dict[str, Any] = out.get(timeout=SECONDS * 10 + 60)
    p.join(30)
    return result


# ---- the database -----------------------------------------------------------

async def fresh_database(server_dsn: str) -> str:
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {DB}")
    finally:
        await admin.close()
    dsn = database.with_database(server_dsn, DB)
    await migrate.migrate_dsn(dsn)
    return dsn


async def xact_count(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", DB))
    finally:
        await conn.close()


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


def pgbench_binary() -> str:
    return str(database.embedded_bin_dir() / "pgbench")  # the embedded server's own


def pgbench(dsn: str, clients: int) -> float:
    script = Path(tempfile.mkdtemp()) / "claim.sql"
    script.write_text(CLAIM_SQL)
    out = subprocess.run([pgbench_binary(), "-n", "-M", "prepared", "-c", str(clients),
                          "-j", str(min(clients, 2)), "-T", str(int(SECONDS)), "-f",
                          str(script), dsn], capture_output=True, text=True, check=True)
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
    assert m, out.stdout
    return float(m.group(1))


async def claim_rate(dsn: str, clients: int) -> float:
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

    started = time.perf_counter()
    await asyncio.gather(*(claimer() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    await pool.close()
    return count / elapsed


async def bench_claims(dsn: str) -> None:
    say("## 1. Lease claims: `LeaseClient.claim` against raw pgbench, same statement\n")
    say("| concurrency | pgbench (claims/s) | LeaseClient (claims/s) | ratio |")
    say("| ---: | ---: | ---: | ---: |")
    for clients in (1, 8, 32):
        base = await asyncio.to_thread(pgbench, dsn, clients)
        ours = await claim_rate(dsn, clients)
        say(f"| {clients} | {base:,.0f} | {ours:,.0f} | {ours / base:.2f}x |")
    say()


# ---- 2. fenced HTTP effects ---------------------------------------------------

def write_config(path: Path, port: int, sink_port: int, smtp_port: int,
                 server: str = "", database_keys: str = "") -> None:
    path.write_text(f"""
[server]
port = {port}
{server}
[database]
url_env = "FENCEGATE_BENCH_DSN"
{database_keys}
[[clients]]
name = "bench"
key_sha256 = "{key_sha256(API_KEY)}"
resources = ["bench:*"]
[providers.sink]
kind = "http"
base_url = "http://127.0.0.1:{sink_port}/hook"
rate_limit_per_second = 1000000
[providers.mail]
kind = "smtp"
host = "127.0.0.1"
port = {smtp_port}
rate_limit_per_second = 1000000
pool_size = 16
""")


@contextlib.asynccontextmanager
async def gateway(dsn: str, sink_port: int, smtp_port: int, workers: int, server: str = "",
                  database_keys: str = "") -> AsyncIterator[tuple[str, list[tuple[str, int]]]]:
    port = free_port()
    cfg = Path(tempfile.mkdtemp()) / "bench.toml"
    write_config(cfg, port, sink_port, smtp_port, server, database_keys)
    with process(PY, "-m", "gateway.cli", "serve", "--config", str(cfg), "--workers",
                 str(workers), env={"FENCEGATE_BENCH_DSN": dsn}):
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url)
        pool = await database.create_pool(dsn, min_size=1, max_size=2)
        client = LeaseClient(pool=pool, owner="bench")
        leases = []
        for i in range(RESOURCES):
            lease = await client.claim(f"bench:{workers}:{i}:{time.time_ns()}", ttl=3600)
            assert lease is not None
            leases.append((lease.resource, lease.fence))
        await pool.close()
        yield url, leases


async def bench_http(dsn: str) -> None:
    sink_port, proxy_port, smtp_port = free_port(), free_port(), free_port()
    say("## 2. Fenced HTTP effect: gateway against a direct call and a bare proxy\n")
    say(f"Moderate load: an open loop at 200 requests/s for {SECONDS:g}s. Saturation: "
        f"a closed loop of 32 callers for {SECONDS:g}s. Effects spread over "
        f"{RESOURCES} leased resources, every request a new idempotency key.\n")
    rows = []
    with process(PY, "-m", "bench.peers", "sink", str(sink_port)), \
            process(PY, "-m", "bench.peers", "proxy", str(proxy_port),
                    f"http://127.0.0.1:{sink_port}"), \
            process(PY, "-m", "bench.peers", "smtp", str(smtp_port)):
        await wait_port(sink_port)
        await wait_port(proxy_port)
        await wait_port(smtp_port)
        targets: list[tuple[str, dict[str, Any]]] = [
            ("direct", {"url": f"http://127.0.0.1:{sink_port}/hook/x"}),
            ("bare proxy", {"url": f"http://127.0.0.1:{proxy_port}/hook/x"}),
        ]
        for name, spec in targets:
            rows.append((name, run_load({"kind": "http", "rate": 200, **spec}),
                         run_load({"kind": "http", "concurrency": 32, **spec})))
        for workers in (1, 2):
            async with gateway(dsn, sink_port, smtp_port, workers) as (url, leases):
                spec = {"url": f"{url}/v1/http/sink/x", "leases": leases}
                rows.append((f"gateway --workers {workers}",
                             run_load({"kind": "http", "rate": 200, "run_id": f"m{workers}",
                                       **spec}),
                             run_load({"kind": "http", "concurrency": 32,
                                       "run_id": f"s{workers}", **spec})))
    direct, bare = rows[0], rows[1]
    say("| path | p50 ms (moderate) | p99 ms (moderate) | +p50 vs direct | +p99 vs direct "
        "| saturation req/s | vs bare proxy | errors |")
    say("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, mod, sat in rows:
        say(f"| {name} | {mod['p50']:.2f} | {mod['p99']:.2f} | "
            f"{mod['p50'] - direct[1]['p50']:+.2f} | {mod['p99'] - direct[1]['p99']:+.2f} | "
            f"{sat['rps']:,.0f} | {sat['rps'] / bare[2]['rps']:.2f}x | "
            f"{mod['errors'] + sat['errors']} |")
    say()


# ---- overload -------------------------------------------------------------------

#: the closed-loop concurrency that saturates one gateway process here (section 2)
SATURATING = 32


async def bench_overload(dsn: str, label: str, server: str = "",
                         database_keys: str = "") -> None:
    """One gateway process, an HTTP provider that answers at once, a fresh key per
    request, at 1x, 4x and 16x the saturating concurrency: what gets through,
    how fast, and what the rest is told."""
    sink_port, smtp_port = free_port(), free_port()
    say(f"### {label}\n")
    say("| callers | 200/s | p50 ms | p99 ms | other answers |")
    say("| ---: | ---: | ---: | ---: | --- |")
    with process(PY, "-m", "bench.peers", "sink", str(sink_port)), \
            process(PY, "-m", "bench.peers", "smtp", str(smtp_port)):
        await wait_port(sink_port)
        async with gateway(dsn, sink_port, smtp_port, 1, server, database_keys) \
                as (url, leases):
            for factor in (1, 4, 16):
                r = run_load({"kind": "http", "concurrency": SATURATING * factor,
                              "url": f"{url}/v1/http/sink/x", "leases": leases,
                              "run_id": f"o{factor}-{time.time_ns()}"})
                other = ", ".join(f"{n:,} {c}" for c, n in sorted(r["codes"].items())) or "none"
                say(f"| {SATURATING * factor} | {r['rps']:,.0f} | {r['p50']:.1f} | "
                    f"{r['p99']:.1f} | {other} |")
    say()


# ---- 3. email -------------------------------------------------------------------

async def bench_email(dsn: str) -> None:
    sink_port, smtp_port = free_port(), free_port()
    say("## 3. Email: gateway against direct aiosmtplib, same aiosmtpd sink\n")
    say(f"A closed loop of 8 senders for {SECONDS:g}s each.\n")
    with process(PY, "-m", "bench.peers", "smtp", str(smtp_port)), \
            process(PY, "-m", "bench.peers", "sink", str(sink_port)):
        await wait_port(smtp_port)
        naive = run_load({"kind": "smtp-naive", "concurrency": 8, "smtp_port": smtp_port})
        pooled = run_load({"kind": "smtp-pooled", "concurrency": 8, "smtp_port": smtp_port})
        async with gateway(dsn, sink_port, smtp_port, 1) as (url, leases):
            body = {"from": "a@example.com", "to": ["b@example.com"], "subject": "bench",
                    "text": "hello"}
            ours = run_load({"kind": "email", "concurrency": 8, "url": f"{url}/v1/email",
                             "leases": leases, "body": body, "run_id": "mail"})
    say("| path | messages/s | p50 ms | p99 ms | gateway vs this |")
    say("| --- | ---: | ---: | ---: | ---: |")
    for name, r in (("direct, a connection per message", naive),
                    ("direct, pooled connections", pooled),
                    ("gateway (pooled, fenced, recorded)", ours)):
        say(f"| {name} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
            f"{ours['rps'] / r['rps']:.2f}x |")
    say()


# ---- 4. the queue against Procrastinate -----------------------------------------

QUEUE_JOBS = 5000


async def fencegate_queue(dsn: str, concurrency: int) -> tuple[float, float]:
    pool = await database.create_pool(dsn, min_size=2, max_size=concurrency + 4)
    q = Queue(LeaseClient(pool=pool, owner="bench"), f"bench{concurrency}")
    started = time.perf_counter()
    for start in range(0, QUEUE_JOBS, 500):
        await q.enqueue_many([NewJob({"n": n}) for n in range(start, start + 500)])
    enqueue_rate = QUEUE_JOBS / (time.perf_counter() - started)

    async def noop(job: Job) -> None:
        return None

    worker = Worker(q, noop, concurrency=concurrency, poll_min=0.005, poll_max=0.05)
    started = time.perf_counter()
    task = asyncio.create_task(worker.run())
    while (await q.stats()).get("completed", 0) < QUEUE_JOBS:
        await asyncio.sleep(0.05)
    rate = QUEUE_JOBS / (time.perf_counter() - started)
    worker.stop()
    await task
    await pool.close()
    return enqueue_rate, rate


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
    say("| concurrency | Procrastinate enqueue/s | fencegate enqueue/s | ratio "
        "| Procrastinate claim+complete/s | fencegate claim+complete/s | ratio |")
    say("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for concurrency in (1, 8, 32):
        dsn = await fresh_database(server_dsn)
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        p = ctx.Process(target=_procrastinate_in_process, args=(dsn, concurrency, out))
        p.start()
        p_enq, p_rate = out.get(timeout=600)
        p.join(30)
        f_enq, f_rate = await fencegate_queue(dsn, concurrency)
        say(f"| {concurrency} | {p_enq:,.0f} | {f_enq:,.0f} | {f_enq / p_enq:.1f}x | "
            f"{p_rate:,.0f} | {f_rate:,.0f} | {f_rate / p_rate:.1f}x |")
    say()


# ---- 5. round trips ----------------------------------------------------------------

async def round_trips(server_dsn: str) -> None:
    say("## 5. Database round trips, counted\n")
    say("Transactions the server committed (pg_stat_database), per effect and per job: "
        "two runs of different sizes, so connection set-up cancels out.\n")
    sink_port, smtp_port = free_port(), free_port()
    per_effect: list[float] = []
    with process(PY, "-m", "bench.peers", "sink", str(sink_port)):
        await wait_port(sink_port)
        for n in (100, 600):
            dsn = await fresh_database(server_dsn)
            async with gateway(dsn, sink_port, smtp_port, 1) as (url, leases):
                before = await xact_count(dsn)
                async with aiohttp.ClientSession() as s:
                    for i in range(n):
                        resource, fence = leases[i % len(leases)]
                        async with s.post(f"{url}/v1/http/sink/x", json={"i": i}, headers={
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


def machine() -> str:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


async def main() -> None:
    server_dsn = os.environ.get(database.DATABASE_URL_ENV) or database.start_embedded()
    dsn = await fresh_database(server_dsn)
    conn = await asyncpg.connect(server_dsn)
    pg_version = await conn.fetchval("SHOW server_version")
    await conn.close()
    say("# fencegate benchmarks\n")
    say(f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}; "
        f"PostgreSQL {pg_version}; each timed phase {SECONDS:g}s. Every ratio compares "
        "two measurements taken in this same run. Load generator: its own process, "
        "pinned to the last CPU. The Python side (LeaseClient, the queues, the load "
        "generator, the gateway) runs on uvloop.\n")
    sections = sys.argv[1:] or ["claims", "http", "email", "queue", "rt", "overload"]
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
    if "overload" in sections:
        say("## 6. Overload: one gateway process at 1x, 4x and 16x its saturating "
            "concurrency\n")
        await bench_overload(dsn, os.environ.get("BENCH_OVERLOAD_LABEL", "as configured"))
    if len(sections) == 6:
        notes = ROOT / "NOTES.md"
        body = "\n".join(OUT) + ("\n" + notes.read_text() if notes.exists() else "")
        (ROOT / "RESULTS.md").write_text(body)
        print(f"wrote {ROOT / 'RESULTS.md'}")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())  # as a production worker would run (docs/leases.md)
