"""``fencegate serve``: one process, or N processes sharing the port."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import tempfile

from aiohttp import web

from leases import database, migrate

from . import logs
from .app import build_app
from .config import Config, load


def database_url(config: Config) -> str:
    return os.environ.get(config.database_url_env) or database.database_url()


def use_uvloop() -> None:
    """uvloop's transports roughly halve the per-request cost of the effect
    path (measured in bench/RESULTS.md)."""
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _run_worker(config_path: str, dsn: str, processes: int) -> None:
    logs.setup()
    use_uvloop()
    config = load(config_path)
    app = build_app(config, dsn, migrate_on_start=False, processes=processes)
    web.run_app(app, host=config.server.host, port=config.server.port, print=None,
                access_log=None, reuse_port=processes > 1)


def serve(config_path: str, workers: int = 1) -> int:
    """Run the gateway until SIGINT or SIGTERM."""
    logs.setup()
    config = load(config_path)
    dsn = database_url(config)
    asyncio.run(migrate.migrate_dsn(dsn))  # once, before any worker takes traffic
    if workers <= 1:
        _run_worker(config_path, dsn, 1)
        return 0
    # N processes bind the port with SO_REUSEPORT; the kernel spreads connections.
    # Metrics are summed across them through prometheus_client's multiprocess
    # mode, which must be on before a worker imports it: hence spawn, not fork.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fencegate-prom-")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_run_worker, args=(config_path, dsn, workers))
             for _ in range(workers)]
    for p in procs:
        p.start()

    def stop(signum: int, frame: object) -> None:
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for p in procs:
        p.join()
    return 0
