"""``fencegate serve``: one process, or N processes sharing the port."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import re
import signal
import socket
import sys
import tempfile
import time

from aiohttp import web

from gateway.app import build_app
from gateway.config import Config, load
from gateway.console.session import secret_for_processes
from gateway.effects.resend import longest_effect_seconds
from gateway.errors import ConfigError
from leases import Unavailable, database, logs, migrate
from leases.cli import CONNECT_ERRORS

log = logging.getLogger("fencegate.serve")


def say(line: str) -> None:
    print(f"fencegate: {line}", file=sys.stderr, flush=True)


def database_url(config: Config) -> str:
    """The DSN in the variable the configuration names. Unset, it is an error,
    unless it is FENCEGATE_DATABASE_URL, whose absence means the embedded
    PostgreSQL everywhere in fencegate (and is said so)."""
    env = config.database_url_env
    dsn = os.environ.get(env)
    if dsn:
        return database.check_dsn(dsn, f"{env} (named by {config.source}: database.url_env)")
    if env != database.DATABASE_URL_ENV:
        raise ConfigError(f"{config.source}: database.url_env: names the environment "
                          f"variable {env}, which is not set")
    return database.database_url(say=lambda s: say(f"database: {s} ({env} is unset)"),
                                 guard=True)


def check_port_free(config: Config) -> None:
    """Fail before anything starts if the address is taken, with what to change."""
    host, port = config.server.host, config.server.port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"{config.source}: server.host: cannot resolve {host!r} "
                          f"({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            why = "is in use (another fencegate?)" if exc.errno == errno.EADDRINUSE \
                else f"cannot be bound ({exc.strerror})"
            raise ConfigError(f"{config.source}: server: {host}:{port} {why}: stop what "
                              "listens there, or change server.port") from None


async def _migrate(dsn: str) -> None:
    try:
        await migrate.migrate_dsn(dsn)
    except CONNECT_ERRORS as exc:
        raise Unavailable(f"cannot reach the database at {database.redacted(dsn)}: "
                          f"{exc or type(exc).__name__}") from exc


def use_uvloop() -> None:
    """uvloop's transports roughly halve the per-request cost of the effect
    path (measured in bench/RESULTS.md)."""
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


#: the cyclic garbage collector's first threshold in a serving process
#: (Python's default is 700 allocations): every request allocates a few
#: hundred objects, nearly all freed by reference counting, so the default
#: ran a collection every couple of requests (5 % of the process's CPU at
#: saturation under py-spy)
GC_FIRST_THRESHOLD = 20_000


def tune_gc() -> None:
    """Fewer collections, and none of them scanning what was loaded at start
    (modules, the configuration, the routes), which lives as long as the
    process."""
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(GC_FIRST_THRESHOLD, second, third)


def _run_worker(config_path: str, dsn: str, processes: int) -> None:
    logs.setup()
    logs.skip_unused_fields()  # it logs through JsonFormatter only
    use_uvloop()
    config = load(config_path)
    app = build_app(config, dsn, migrate_on_start=False, processes=processes)
    tune_gc()

    def listening(message: str) -> None:  # aiohttp's "Running on http://..."
        if processes == 1:
            found = re.search(r"https?://\S+", message)
            url = found.group(0) if found else f"{config.server.host}:{config.server.port}"
            say(f"listening on {url} (the API; the console at {url}/console, the API "
                f"reference at {url}/docs)")

    web.run_app(app, host=config.server.host, port=config.server.port, print=listening,
                access_log=None, reuse_port=processes > 1,
                shutdown_timeout=shutdown_seconds(config))


#: beyond the longest request: the answer's own write, the outcome's record
SHUTDOWN_MARGIN_SECONDS = 3.0


def shutdown_seconds(config: Config) -> float:
    """How long a stopping gateway waits for the requests it is serving: the
    longest effect any provider can take, and a margin. Past it aiohttp
    cancels them (their connections reset: nothing more is delivered, but
    their outcomes are unknown). A platform's grace period must cover it
    (deploy/kubernetes: terminationGracePeriodSeconds)."""
    longest = max((longest_effect_seconds(config.server, p)
                   for p in config.providers.values()), default=0.0)
    return longest + SHUTDOWN_MARGIN_SECONDS


#: a worker process that dies is replaced after this long, doubling while
#: replacements keep dying young, up to RESTART_MAX_SECONDS
RESTART_MIN_SECONDS = 0.5
RESTART_MAX_SECONDS = 30.0
#: a worker that lived this long was healthy: its replacement starts at once
HEALTHY_SECONDS = 60.0


def serve(config_path: str, workers: int = 1) -> int:
    """Run the gateway until SIGINT or SIGTERM."""
    logs.setup()
    config = load(config_path)
    check_port_free(config)
    dsn = database_url(config)
    asyncio.run(_migrate(dsn))  # once, before any worker takes traffic
    if workers > 1:
        url = f"http://{config.server.host}:{config.server.port}"
        say(f"listening on {url} with {workers} processes (the console at {url}/console, "
            f"the API reference at {url}/docs)")
    if workers <= 1:
        _run_worker(config_path, dsn, 1)
        return 0
    # one console session key for every serving process (gateway/console/session.py)
    secret_for_processes()
    # N processes bind the port with SO_REUSEPORT; the kernel spreads connections.
    # Metrics are summed across them through prometheus_client's multiprocess
    # mode, which must be on before a worker imports it: hence spawn, not fork.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fencegate-prom-")
    return Supervisor(config_path, dsn, workers).run()


class Supervisor:
    """Keeps ``workers`` serving processes up: one that dies is replaced (after
    a backoff while replacements keep dying young), until SIGTERM or SIGINT,
    which it passes on before waiting for them all."""

    def __init__(self, config_path: str, dsn: str, workers: int) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.args = (config_path, dsn, workers)
        self.workers = workers
        self.procs: dict[int, tuple[multiprocessing.process.BaseProcess, float]] = {}
        self.stopping = False
        self.delay = RESTART_MIN_SECONDS

    def _start(self) -> None:
        p = self.ctx.Process(target=_run_worker, args=self.args)
        p.start()
        assert p.pid is not None
        self.procs[p.pid] = (p, time.monotonic())

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True
        for p, _ in self.procs.values():
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(min(0.1, end - time.monotonic()))

    def run(self) -> int:
        for _ in range(self.workers):
            self._start()
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        while self.procs:
            sentinels = {p.sentinel: pid for pid, (p, _) in self.procs.items()}
            for ready in multiprocessing.connection.wait(list(sentinels), timeout=1.0):
                pid = sentinels[ready]  # type: ignore[index]
                proc, started = self.procs.pop(pid)
                proc.join()
                if self.stopping:
                    continue
                lived = time.monotonic() - started
                log.error("a serving process exited; replacing it", extra={
                    "pid": pid, "exitcode": proc.exitcode, "lived_seconds": round(lived, 1)})
                self.delay = RESTART_MIN_SECONDS if lived >= HEALTHY_SECONDS \
                    else min(RESTART_MAX_SECONDS, self.delay * 2)
                self._sleep(self.delay if lived < HEALTHY_SECONDS else 0)
                if not self.stopping:
                    self._start()
        return 0
