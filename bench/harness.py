"""What every benchmark section shares: the phase lengths, the report being
written, child processes, the database, and a gateway to measure.

BENCH_SECONDS sets the length of each timed phase (default 5), BENCH_WARMUP
the warm-up before each (default 1): short phases while developing, e.g.
``BENCH_SECONDS=1 BENCH_WARMUP=0.5 python -m bench.run http``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg

from gateway.api.auth import key_sha256
from leases import LeaseClient, database, migrate

SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
WARMUP_SECONDS = float(os.environ.get("BENCH_WARMUP", "1"))
DB = "fencegate_bench"
API_KEY = "bench-key"
#: leased resources the effects are spread over, unless a section says otherwise
RESOURCES = 64
ROOT = Path(__file__).resolve().parent
PY = sys.executable
OUT: list[str] = []


def say(line: str = "") -> None:
    """One line of the report (bench/RESULTS.md), echoed as it is written."""
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


def peer(kind: str, port: int, *args: str) -> contextlib.AbstractContextManager[
        subprocess.Popen[bytes]]:
    """One of bench/peers.py in a process of its own."""
    return process(PY, "-m", "bench.peers", kind, str(port), *args)


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


# ---- the database -----------------------------------------------------------

async def fresh_database(server_dsn: str, name: str = DB) -> str:
    """A database ``name`` made anew on the server, migrated; its DSN."""
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    dsn = database.with_database(server_dsn, name)
    await migrate.migrate_dsn(dsn)
    return dsn


async def xact_count(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", DB))
    finally:
        await conn.close()


async def postmaster_pid(dsn: str) -> int | None:
    """The PostgreSQL server's own process, when it runs on this machine (the
    parent of every backend): None for a server elsewhere."""
    import psutil

    conn = await asyncpg.connect(dsn)
    try:  # while the backend is there to be asked
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(backend).parent()
            if parent is not None and parent.name() in ("postgres", "postmaster"):
                return int(parent.pid)
        return None
    finally:
        await conn.close()


# ---- a gateway ---------------------------------------------------------------

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


class Gateway:
    """A running ``fencegate serve``: its URL, its process (the root of its
    process tree) and the leases the load is spread over, as (resource, fence)."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes],
                 leases: list[tuple[str, int]]) -> None:
        self.url, self.proc, self.leases = url, proc, leases


async def claim_leases(dsn: str, prefix: str, count: int) -> list[tuple[str, int]]:
    """``count`` fresh leases, claimed as a worker would (concurrently: the
    client batches them)."""
    pool = await database.create_pool(dsn, min_size=1, max_size=4)
    client = LeaseClient(pool=pool, owner="bench")
    leases: list[tuple[str, int]] = []
    try:
        for start in range(0, count, 1000):
            got = await asyncio.gather(*(client.claim(f"{prefix}:{i}", ttl=3600)
                                         for i in range(start, min(count, start + 1000))))
            for lease in got:
                assert lease is not None
                leases.append((lease.resource, lease.fence))
    finally:
        await pool.close()
    return leases


@contextlib.asynccontextmanager
async def gateway(dsn: str, sink_port: int, smtp_port: int, workers: int, server: str = "",
                  database_keys: str = "", resources: int = RESOURCES,
                  gateway_dsn: str | None = None) -> AsyncIterator[Gateway]:
    """``fencegate serve --workers N`` against ``gateway_dsn`` (default ``dsn``),
    with ``resources`` leases claimed through ``dsn``."""
    port = free_port()
    cfg = Path(tempfile.mkdtemp()) / "bench.toml"
    write_config(cfg, port, sink_port, smtp_port, server, database_keys)
    with process(PY, "-m", "gateway.cli", "serve", "--config", str(cfg), "--workers",
                 str(workers), env={"FENCEGATE_BENCH_DSN": gateway_dsn or dsn}) as proc:
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url)
        leases = await claim_leases(dsn, f"bench:{workers}:{time.time_ns()}", resources)
        yield Gateway(url, proc, leases)
