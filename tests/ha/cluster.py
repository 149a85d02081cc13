"""A highly available PostgreSQL and scaled-out gateways, as real processes on
loopback, with the two failures the HA run inflicts: a switchover and a hard
failover.

    workers ─┬─▶ gateway 0 ─┐
             ├─▶ gateway 1 ─┼─▶ HAProxy ─────────────────┬─▶ pg0 (Patroni) ─┐
             └─▶ gateway 2 ─┴─▶ PgBouncer (transaction) ─┘   pg1 (Patroni) ─┼─▶ etcd
                                                             pg2 (Patroni) ─┘
    (each worker's lease client: HAProxy, or PgBouncer)

- etcd (Debian's etcd-server) is the distributed configuration store: Patroni
  keeps the leader key there, with a ttl.
- Three PostgreSQL 15 members (Debian's postgresql-15 binaries), each managed
  by Patroni (PyPI) with its own data directory, port and REST API; with
  ``synchronous_mode`` a commit waits for one synchronous standby, and only
  that standby may be promoted.
- HAProxy routes to the member whose Patroni answers ``GET /primary`` with 200
  (the holder of the leader key) and cuts the sessions of a member marked
  down (docs/operations.md says why HAProxy rather than a multi-host DSN).
- PgBouncer in transaction mode, in front of HAProxy, for one gateway and half
  the workers: their DSN carries ``statement_cache_size=0``.

PostgreSQL refuses to run as root, so Patroni (and PgBouncer, which refuses
too) run as the ``postgres`` user from a virtual environment on Debian's
``/usr/bin/python3`` (the project's interpreter may sit under a home folder
that user cannot read): ``tests/ha/install.sh`` makes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil

from gateway.api.auth import key_sha256
from leases import migrate
from tests.chaos.cluster import API_KEY, CLIENT  # the lane workers send this key
from tests.chaos.history import Recorder

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
PATRONI_VENV = ROOT / ".venv-patroni"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "postgres"
SCOPE = "fencegate-ha"
DATABASE = "fencegate"
#: the role of the gateway behind PgBouncer: PgBouncer refuses the
#: statement_timeout startup parameter the gateway sends, so the role carries it
POOLED_ROLE = "fencegate_pooled"
PROVIDER_TIMEOUT = 1.0
DATABASE_TIMEOUT = 1.0
HTTP_WINDOW = 60.0
#: Patroni's timing: the leader key lives 20 s (Patroni's minimum) without a
#: renewal, and members look every 2 s. A hard failover takes about ttl.
PATRONI_TTL = 20
PATRONI_LOOP_WAIT = 2
PATRONI_RETRY_TIMEOUT = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Member:
    name: str
    port: int
    rest_port: int
    dir: Path
    config: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"


class HACluster:
    def __init__(self, workdir: Path, *, synchronous: bool, seed: int,
                 slow_fraction: float = 0.01, members: int = 3, gateways: int = 3) -> None:
        self.dir = workdir
        self.history = workdir / "history"
        self.synchronous = synchronous
        self.seed = seed
        self.slow_fraction = slow_fraction
        self.rec = Recorder(self.history, "orchestrator")
        self.n_members = members
        self.n_gateways = gateways
        self.members: list[Member] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.gateways: list[subprocess.Popen[bytes]] = []
        self.gateway_ports: list[int] = []
        self.etcd: subprocess.Popen[bytes] | None = None
        self.pg = pwd.getpwnam(PG_USER)

    # ---- DSNs ------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """Through HAProxy, to whichever member holds the leader key."""
        return f"postgresql://postgres@127.0.0.1:{self.haproxy_port}/{DATABASE}"

    @property
    def pooled_dsn(self) -> str:
        """Through PgBouncer (transaction mode), then HAProxy."""
        return (f"postgresql://{POOLED_ROLE}@127.0.0.1:{self.pgbouncer_port}/{DATABASE}"
                "?statement_cache_size=0")

    @property
    def pg_dsn(self) -> str:  # the name the chaos suite's helpers use
        return self.dsn

    def gateway_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.gateway_ports[i % len(self.gateway_ports)]}"

    # ---- lifecycle -------------------------------------------------------------

    def _log(self, name: str) -> Any:
        return (self.dir / f"{name}.log").open("ab")

    def _popen(self, args: list[str], name: str, *, as_pg: bool = False,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with self._log(name) as log:
            return subprocess.Popen(
                args, cwd=self.dir if as_pg else ROOT, stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True,
                user=self.pg.pw_uid if as_pg else None,
                group=self.pg.pw_gid if as_pg else None,
                extra_groups=[] if as_pg else None,
                env={**os.environ, "HOME": str(self.dir), **(env or {})})

    async def start(self) -> None:
        self.dir.chmod(0o755)  # the postgres user works in here
        self.history.mkdir(exist_ok=True)
        self._start_etcd()
        self.members = [self._member(i) for i in range(self.n_members)]
        for m in self.members:
            self.start_member(m)
            await self.wait_leader(timeout=90)  # one by one: the first bootstraps
        await self.wait_replicas(self.n_members - 1, timeout=120)
        self._start_haproxy()
        await self._prepare_database()
        self._start_pgbouncer()
        self._start_sinks()
        self._start_gateways()
        for i in range(self.n_gateways):
            await self.wait_gateway(i)

    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        self.etcd = self._popen([
            "etcd", "--name", "ha0", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"ha0=http://127.0.0.1:{peer}",
            "--log-level", "warn"], "etcd")

    def _member(self, i: int) -> Member:
        m = Member(f"pg{i}", free_port(), free_port(), self.dir / f"pg{i}",
                   self.dir / f"pg{i}.yml")
        m.dir.mkdir()
        os.chown(m.dir, self.pg.pw_uid, self.pg.pw_gid)
        sync = "true" if self.synchronous else "false"
        m.config.write_text(f"""
scope: {SCOPE}
namespace: /fencegate/
name: {m.name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{m.rest_port}
  connect_address: 127.0.0.1:{m.rest_port}
etcd3:
  hosts: 127.0.0.1:{self.etcd_port}
bootstrap:
  dcs:
    ttl: {PATRONI_TTL}
    loop_wait: {PATRONI_LOOP_WAIT}
    retry_timeout: {PATRONI_RETRY_TIMEOUT}
    maximum_lag_on_failover: 1048576
    synchronous_mode: {sync}
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      parameters:
        max_connections: 300
        wal_log_hints: "on"
        synchronous_commit: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{m.port}
  connect_address: 127.0.0.1:{m.port}
  data_dir: {m.data_dir}
  bin_dir: {PG_BIN}
  pgpass: {m.dir}/pgpass
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    replication: {{username: replicator, password: replicator}}
    superuser: {{username: postgres, password: postgres}}
    rewind: {{username: postgres, password: postgres}}
  parameters:
    unix_socket_directories: '{m.dir}'
tags: {{nofailover: false, noloadbalance: false, clonefrom: false, nosync: false}}
""")
        m.config.chmod(0o644)
        return m

    def start_member(self, m: Member) -> None:
        m.proc = self._popen([str(PATRONI_VENV / "bin" / "patroni"), str(m.config)],
                             m.name, as_pg=True)

    def _start_haproxy(self) -> None:
        self.haproxy_port = free_port()
        servers = "\n".join(
            f"    server {m.name} 127.0.0.1:{m.port} maxconn 250 check port {m.rest_port}"
            for m in self.members)
        cfg = self.dir / "haproxy.cfg"
        cfg.write_text(f"""
global
    maxconn 2000
defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s
listen primary
    bind 127.0.0.1:{self.haproxy_port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 250ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
""")
        self.procs.append(self._popen(["haproxy", "-db", "-f", str(cfg)], "haproxy"))

    async def _prepare_database(self) -> None:
        admin = await self._connect_retrying(
            f"postgresql://postgres@127.0.0.1:{self.haproxy_port}/postgres", 30)
        try:
            await admin.execute(f"CREATE DATABASE {DATABASE}")
            await admin.execute(f"CREATE ROLE {POOLED_ROLE} LOGIN SUPERUSER")
            await admin.execute(f"ALTER ROLE {POOLED_ROLE} SET statement_timeout = "
                                f"{int(DATABASE_TIMEOUT * 1000)}")
        finally:
            await admin.close()
        await migrate.migrate_dsn(self.dsn)

    def _start_pgbouncer(self) -> None:
        self.pgbouncer_port = free_port()
        home = self.dir / "pgbouncer"  # it runs as postgres, and writes its log here
        home.mkdir()
        os.chown(home, self.pg.pw_uid, self.pg.pw_gid)
        users = self.dir / "pgbouncer-users.txt"
        users.write_text(f'"postgres" ""\n"{POOLED_ROLE}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(f"""
[databases]
{DATABASE} = host=127.0.0.1 port={self.haproxy_port} dbname={DATABASE}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.pgbouncer_port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
server_connect_timeout = 2
server_login_retry = 1
query_wait_timeout = 5
ignore_startup_parameters = statement_timeout
logfile = {home}/pgbouncer.log
""")
        for f in (users, ini):
            f.chmod(0o644)
        self.procs.append(self._popen(["pgbouncer", str(ini)], "pgbouncer", as_pg=True))

    def _start_sinks(self) -> None:
        self.smtp_port, self.http_port = free_port(), free_port()
        self.procs.append(self._popen(
            [PY, "-m", "tests.chaos.sinks", str(self.smtp_port), str(self.http_port),
             str(self.history), str(self.seed), str(self.slow_fraction), str(HTTP_WINDOW)],
            "sinks"))

    def _gateway_config(self, i: int) -> Path:
        port = free_port()
        self.gateway_ports.append(port)
        path = self.dir / f"gateway{i}.toml"
        path.write_text(f"""
[server]
port = {port}
database_timeout_seconds = {DATABASE_TIMEOUT}
[database]
url_env = "HA_DATABASE_URL"
[[clients]]
name = "{CLIENT}"
key_sha256 = "{key_sha256(API_KEY)}"
resources = ["run:*", "job:*"]
[providers.mail]
kind = "smtp"
host = "127.0.0.1"
port = {self.smtp_port}
timeout_seconds = {PROVIDER_TIMEOUT}
rate_limit_per_second = 100000
[providers.crm]
kind = "http"
base_url = "http://127.0.0.1:{self.http_port}/api"
timeout_seconds = {PROVIDER_TIMEOUT}
rate_limit_per_second = 100000
idempotency_header = "Idempotency-Key"
idempotency_window_seconds = {HTTP_WINDOW}
""")
        return path

    def gateway_dsn(self, i: int) -> str:
        """The last gateway goes through PgBouncer, the others through HAProxy."""
        return self.pooled_dsn if i == self.n_gateways - 1 else self.dsn

    def _start_gateways(self) -> None:
        for i in range(self.n_gateways):
            config = self._gateway_config(i)
            self.gateways.append(self._popen(
                [PY, "-m", "gateway.cli", "serve", "--config", str(config)], f"gateway{i}",
                env={"HA_DATABASE_URL": self.gateway_dsn(i)}))

    def spawn(self, module: str, *args: str, name: str) -> subprocess.Popen[bytes]:
        return self._popen([PY, "-m", module, *args], name)

    # ---- observation -----------------------------------------------------------

    async def _connect_retrying(self, dsn: str, timeout: float) -> asyncpg.Connection:
        end = time.monotonic() + timeout
        while True:
            try:
                return await asyncpg.connect(dsn, timeout=2)
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.2)

    async def writable(self, m: Member) -> bool:
        """Whether ``m`` is a primary that accepts writes now (asked directly)."""
        try:
            conn = await asyncpg.connect(m.dsn(), timeout=1)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        try:
            return not await asyncio.wait_for(conn.fetchval("SELECT pg_is_in_recovery()"), 1)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        finally:
            conn.terminate()

    async def patroni(self, m: Member, path: str) -> tuple[int, dict[str, Any]]:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s, \
                    s.get(f"http://127.0.0.1:{m.rest_port}{path}") as r:
                return r.status, await r.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return 0, {}

    async def leader(self) -> Member | None:
        for m in self.members:
            status, _ = await self.patroni(m, "/primary")
            if status == 200:
                return m
        return None

    async def wait_leader(self, timeout: float) -> Member:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = await self.leader()
            if m is not None and await self.writable(m):
                return m
            await asyncio.sleep(0.2)
        raise RuntimeError("no leader")

    async def wait_replicas(self, n: int, timeout: float) -> None:
        """Until ``n`` members stream from the leader (and, with synchronous
        replication, one of them is synchronous)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            status, cluster = await self.patroni(self.members[0], "/cluster")
            if status == 200:
                roles = [x.get("role") for x in cluster.get("members", [])
                         if x.get("state") in ("streaming", "running")]
                replicas = [r for r in roles if r in ("replica", "sync_standby")]
                if len(replicas) >= n and (not self.synchronous or "sync_standby" in roles):
                    return
            await asyncio.sleep(0.5)
        raise RuntimeError(f"fewer than {n} replicas streaming")

    async def wait_gateway(self, i: int, timeout: float = 60) -> float:
        started = time.monotonic()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while time.monotonic() - started < timeout:
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with s.get(f"{self.gateway_url(i)}/readyz") as r:
                        if r.status == 200:
                            return time.monotonic() - started
                await asyncio.sleep(0.05)
        raise RuntimeError(f"gateway {i} never became ready")

    async def watch_writable(self, since: float, timeout: float = 90) -> tuple[float, float,
                                                                               Member]:
        """Poll every member until one is a writable primary again after an
        outage that began at ``since``: answers the outage as this process saw it
        (the first poll that found no writable primary, the last one before a
        writable one was found) and the new primary."""
        first_down: float | None = None
        last_down = since
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            polled = time.time()
            found = [m for m, ok in zip(
                self.members, await asyncio.gather(*(self.writable(m) for m in self.members)),
                strict=True) if ok]
            if found and first_down is not None:
                return first_down, last_down, found[0]
            if not found:
                first_down = first_down or polled
                last_down = polled
            await asyncio.sleep(0.05)
        raise RuntimeError("no writable primary came back")

    # ---- failures ----------------------------------------------------------------

    def fault(self, kind: str, start: float, end: float, db_outage: bool = False,
              **extra: Any) -> None:
        self.rec.record("fault", kind=kind, start=start, end=end, db_outage=db_outage,
                        **extra)

    async def switchover(self) -> dict[str, Any]:
        """``patronictl switchover`` to a healthy replica."""
        old = await self.wait_leader(30)
        await self.wait_replicas(self.n_members - 1, 120)
        _, cluster = await self.patroni(old, "/cluster")
        wanted = "sync_standby" if self.synchronous else "replica"
        candidates = [x["name"] for x in cluster.get("members", []) if x.get("role") == wanted]
        commanded = time.time()
        args = [str(PATRONI_VENV / "bin" / "patronictl"), "-c", str(old.config), "switchover",
                "--leader", old.name, "--candidate", candidates[0], "--force"]
        watch = asyncio.create_task(self.watch_writable(commanded))
        done = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True,
                                       user=self.pg.pw_uid, group=self.pg.pw_gid,
                                       extra_groups=[], cwd=self.dir,
                                       env={**os.environ, "HOME": str(self.dir)})
        if done.returncode != 0:
            watch.cancel()
            raise RuntimeError(f"switchover failed: {done.stdout} {done.stderr}")
        down, up, new = await watch
        info = {"kind": "switchover", "from": old.name, "to": new.name, "commanded": commanded,
                "down": down, "up": up}
        self.fault("switchover", down, up, db_outage=True, commanded=commanded,
                   old=old.name, new=new.name)
        return info

    async def hard_failover(self, lag_seconds: float = 0.0,
                            restart_after: float = 5.0) -> dict[str, Any]:
        """SIGKILL the leader's Patroni and every process of its PostgreSQL at
        once; wait for a standby to be promoted; start the dead member again
        (it rejoins as a replica, rewound if it had diverged).

        ``lag_seconds``: first hold the leader's WAL senders (SIGSTOP) that
        long, as a congested link between the members would, then kill: what
        they had not sent is lost with the leader. On loopback a standby is
        otherwise microseconds behind, and a kill almost never finds a commit
        it has not received. (Holding the standbys' receivers instead does
        not do it: the bytes wait in their socket buffers.)"""
        old = await self.wait_leader(30)
        await self.wait_replicas(self.n_members - 1, 120)
        victims = [old.proc.pid] if old.proc is not None else []
        postmaster = _postmaster(old)
        victims += [postmaster, *(c.pid for c in psutil.Process(postmaster).children(True))]
        held = [c.pid for c in psutil.Process(postmaster).children()
                if "walsender" in " ".join(c.cmdline())] if lag_seconds else []
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(lag_seconds)
        killed = time.time()
        for pid in victims:  # the held senders among them
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if old.proc is not None:
            old.proc.wait()
        _, up, new = await self.watch_writable(killed)
        info = {"kind": "failover", "from": old.name, "to": new.name, "commanded": killed,
                "down": killed, "up": up, "lag": lag_seconds}
        self.fault("failover", killed, up, db_outage=True, commanded=killed,
                   old=old.name, new=new.name, lag=lag_seconds)
        await asyncio.sleep(restart_after)
        self.start_member(old)
        return info

    async def close(self) -> None:
        for p in [*self.gateways, *self.procs]:
            _stop(p)
        for m in self.members:
            if m.proc is not None:
                _stop(m.proc, signal.SIGTERM, 20)
            _kill_postgres(m)
        if self.etcd is not None:
            _stop(self.etcd)  # last: Patroni stops cleanly only while it can reach it
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)


def _stop(p: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 5) -> None:
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)
    try:
        p.wait(wait)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _postmaster(m: Member) -> int:
    return int((m.data_dir / "postmaster.pid").read_text().split()[0])


def _kill_postgres(m: Member) -> None:
    """Whatever PostgreSQL of this member still runs (Patroni lets its
    postmaster outlive it by design)."""
    pid_file = m.data_dir / "postmaster.pid"
    with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
        pid = int(pid_file.read_text().split()[0])
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            if "postgres" in proc.name():
                for c in [*proc.children(True), proc]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        c.kill()
