"""What a worker process shows Prometheus: a ``/metrics`` endpoint, and a
collector of the queues' depth and the database's reachability.

The lease and queue counters (``fencegate_lease_claims_total``,
``fencegate_lease_renewals_total``, ``fencegate_jobs_total``) are counted in the
process that claims, renews and completes, so a worker must expose them itself::

    await Worker(queue, handle, metrics_port=9464).run()

or, for a process that runs several workers or no ``Worker`` at all::

    server = await leases.observe.serve(9464, client=client)
    ...
    await server.close()

The queue gauges are read from the database by one cheap statement, at most
once every ``max_age`` seconds however often and however many scrapers ask:

- ``fencegate_queue_jobs{queue, state}``: jobs ``queued`` (due now),
  ``scheduled`` (due later), ``claimed`` and ``dead``;
- ``fencegate_queue_oldest_runnable_age_seconds{queue}``: how long the oldest
  due job has waited (0: none is due);
- ``fencegate_queue_paused{queue}``: 1 while the queue is paused
  (``fencegate jobs pause``), else 0;
- ``fencegate_database_up``: 1 if the last read of the database answered in
  time, else 0.

Completed and cancelled jobs are not counted (they only grow); their rates
are ``fencegate_jobs_total{event="completed"}`` and ``{event="cancelled"}``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import asyncpg
from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from . import database
from .client import LeaseClient
from .errors import Unavailable
from .metrics import start_at_zero

log = logging.getLogger("fencegate.observe")

#: a scrape within this many seconds of the last read answers from the cache
DEFAULT_MAX_AGE_SECONDS = 5.0
#: a read slower than this counts as the database being down
DEFAULT_TIMEOUT_SECONDS = 2.0
DEFAULT_HOST = "0.0.0.0"  # scraped from outside the container; no secret is shown
QUEUE_STATES = ("queued", "scheduled", "claimed", "dead")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class QueueDepth:
    """One queue's gauges, as last read."""

    jobs: dict[str, int]
    oldest_runnable_seconds: float
    paused: bool = False


class QueueCollector:
    """A Prometheus collector of every queue's depth by state, the age of each
    queue's oldest runnable job, and ``fencegate_database_up``.

    ``await refresh()`` before each exposition (``serve`` does); ``collect()``
    answers from what the last refresh read and never touches the database."""

    def __init__(self, client: LeaseClient, *, queues: Iterable[str] = (),
                 max_age: float = DEFAULT_MAX_AGE_SECONDS,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.client = client
        #: queues shown even with no open job (as zeros): those named, and every
        #: queue seen since, so a drained queue reads 0 rather than vanishing
        self.known: set[str] = set(queues)
        self.max_age = max_age
        self.timeout = timeout
        self.depths: dict[str, QueueDepth] = {}
        self.database_up = False
        #: statements sent so far (one per refresh that was not served from the cache)
        self.reads = 0
        self._read_at = float("-inf")
        self._reading: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """Read the database unless the last read is younger than ``max_age``;
        concurrent callers share one read. Never raises for an unreachable
        database: the gauges go empty and ``fencegate_database_up`` to 0."""
        if time.monotonic() - self._read_at < self.max_age:
            return
        if self._reading is None or self._reading.done():
            self._reading = asyncio.get_running_loop().create_task(self._read())
        await asyncio.shield(self._reading)

    async def _read(self) -> None:
        self.reads += 1
        try:
            async with database.answered(self.timeout):
                rows = await self._fetch()
        except (Unavailable, asyncpg.PostgresError) as exc:
            log.warning("queue depths unreadable", extra={"error": type(exc).__name__})
            self.depths, self.database_up = {}, False
        else:
            self.depths, self.database_up = depths_of(rows), True
            self.known.update(self.depths)
        self._read_at = time.monotonic()

    async def _fetch(self) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await self.client.fetch("queue_depths")
        return rows

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        return self._families()

    def _families(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("fencegate_queue_jobs",
                                 "Jobs in each queue, by state (completed jobs not counted).",
                                 labels=["queue", "state"])
        oldest = GaugeMetricFamily("fencegate_queue_oldest_runnable_age_seconds",
                                   "How long each queue's oldest due job has waited.",
                                   labels=["queue"])
        empty = QueueDepth({}, 0.0)
        shown = sorted(self.known) if self.database_up else []
        for queue in shown:
            depth = self.depths.get(queue, empty)
            for state in QUEUE_STATES:
                jobs.add_metric([queue, state], depth.jobs.get(state, 0))
            oldest.add_metric([queue], depth.oldest_runnable_seconds)
        yield jobs
        yield oldest
        paused = GaugeMetricFamily("fencegate_queue_paused",
                                   "1 while the queue is paused (no job is claimed), else 0.",
                                   labels=["queue"])
        for queue in shown:
            paused.add_metric([queue], 1 if self.depths.get(queue, empty).paused else 0)
        yield paused
        yield GaugeMetricFamily("fencegate_database_up",
                                "1 if the database answered the last read in time, else 0.",
                                value=1 if self.database_up else 0)


def depths_of(rows: Iterable[asyncpg.Record]) -> dict[str, QueueDepth]:
    """``queue_depths`` rows as one ``QueueDepth`` per queue (pure)."""
    jobs: dict[str, dict[str, int]] = {}
    oldest: dict[str, float] = {}
    paused: set[str] = set()
    for r in rows:
        if r["state"] == "paused":  # not a job state: the queue's own
            paused.add(r["queue"])
            jobs.setdefault(r["queue"], {})
            continue
        jobs.setdefault(r["queue"], {})[r["state"]] = int(r["jobs"])
        if r["state"] == "queued":
            oldest[r["queue"]] = max(0.0, float(r["oldest_seconds"]))
    return {q: QueueDepth(by_state, oldest.get(q, 0.0), q in paused)
            for q, by_state in jobs.items()}


def exposition(collector: QueueCollector | None,
               registry: CollectorRegistry = REGISTRY) -> bytes:
    """The Prometheus text of ``registry`` followed by ``collector``'s gauges."""
    text = generate_latest(registry)
    if collector is not None:
        own = CollectorRegistry(auto_describe=False)
        own.register(collector)
        text += generate_latest(own)
    return text


class MetricsServer:
    """An aiohttp server on this event loop answering ``GET /metrics``."""

    def __init__(self, collector: QueueCollector | None, registry: CollectorRegistry) -> None:
        self.collector = collector
        self.registry = registry
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> MetricsServer:
        app = web.Application()
        app[METRICS_SERVER] = self
        app.router.add_get("/metrics", _metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.create_server((host, port), family=_family(host))
        self.port = int(sock.getsockname()[1])
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self._runner = runner
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


METRICS_SERVER = web.AppKey("metrics_server", MetricsServer)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def _metrics(request: web.Request) -> web.StreamResponse:
    server = request.app[METRICS_SERVER]
    if server.collector is not None:
        await server.collector.refresh()
    return web.Response(body=exposition(server.collector, server.registry),
                        headers={"Content-Type": CONTENT_TYPE})


async def serve(port: int, *, host: str = DEFAULT_HOST, client: LeaseClient | None = None,
                queues: Iterable[str] = (), registry: CollectorRegistry = REGISTRY,
                max_age: float = DEFAULT_MAX_AGE_SECONDS) -> MetricsServer:
    """Serve this process's metrics on ``http://host:port/metrics`` until
    ``close()``; with ``client``, the gauges of every queue in its database too
    (``queues`` are shown as zeros even before they hold a job). Port 0 picks a
    free port (``.port`` tells which)."""
    queues = list(queues)
    start_at_zero(queues)
    collector = QueueCollector(client, queues=queues, max_age=max_age) \
        if client is not None else None
    return await MetricsServer(collector, registry).start(host, port)
