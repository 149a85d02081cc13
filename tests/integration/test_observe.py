"""What a worker shows Prometheus (leases.observe), on a real PostgreSQL:
the queue gauges, their cache, the worker's /metrics endpoint, and the gauges
on the gateway's /metrics."""

from __future__ import annotations

import asyncio
import datetime as dt
import socket

import aiohttp
import asyncpg
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from leases import LeaseClient, Queue, Worker, observe
from leases.queue import Job

from .conftest import Gw

LONG_AGO = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
FAR_AHEAD = dt.datetime(2999, 1, 1, tzinfo=dt.UTC)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by name and labels."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def depth(found: Samples, queue: str, state: str) -> float | None:
    return found.get(("fencegate_queue_jobs", (("queue", queue), ("state", state))))


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return samples(await r.text())


async def fill(pool: asyncpg.Pool) -> None:
    """Two queues: mail has 2 due (one long overdue), 1 scheduled, 1 claimed,
    1 dead; sms has 1 due."""
    client = LeaseClient(pool=pool, owner="filler")
    mail = Queue(client, "mail")
    await mail.enqueue({"n": 1}, run_at=LONG_AGO, max_attempts=1)
    await mail.enqueue({"n": 2}, run_at=LONG_AGO)
    [dying] = await mail.claim(limit=1)
    assert await mail.fail(dying, "boom") == "dead"
    await mail.enqueue({"n": 3})
    await mail.enqueue({"n": 4}, run_at=FAR_AHEAD)
    await mail.enqueue({"n": 5}, run_at=LONG_AGO, priority=1)
    [held] = await mail.claim(limit=1)
    assert held.payload == {"n": 5}
    await Queue(client, "sms").enqueue({"n": 6})


async def test_the_collector_reads_depth_by_queue_and_state(pool: asyncpg.Pool) -> None:
    await fill(pool)
    collector = observe.QueueCollector(LeaseClient(pool=pool))
    await collector.refresh()
    found = samples(observe.exposition(collector, CollectorRegistry()).decode())
    assert {st: depth(found, "mail", st) for st in observe.QUEUE_STATES} == \
        {"queued": 2, "scheduled": 1, "claimed": 1, "dead": 1}
    assert {st: depth(found, "sms", st) for st in observe.QUEUE_STATES} == \
        {"queued": 1, "scheduled": 0, "claimed": 0, "dead": 0}
    # the oldest due mail job has waited since 2020 (by the database's clock)
    oldest = found[("fencegate_queue_oldest_runnable_age_seconds", (("queue", "mail"),))]
    assert oldest > (dt.datetime(2025, 1, 1, tzinfo=dt.UTC) - LONG_AGO).total_seconds()
    assert found[("fencegate_database_up", ())] == 1


async def test_a_queue_with_nothing_due_has_age_zero(pool: asyncpg.Pool) -> None:
    q = Queue(LeaseClient(pool=pool), "later")
    await q.enqueue({}, run_at=FAR_AHEAD)
    collector = observe.QueueCollector(LeaseClient(pool=pool))
    await collector.refresh()
    assert collector.depths == {"later": observe.QueueDepth({"scheduled": 1}, 0.0)}


async def test_a_drained_queue_reads_zero_rather_than_vanishing(pool: asyncpg.Pool) -> None:
    q = Queue(LeaseClient(pool=pool), "drained")
    await q.enqueue({})
    collector = observe.QueueCollector(LeaseClient(pool=pool), queues=["idle"], max_age=0)
    await collector.refresh()
    [job] = await q.claim()
    assert await q.complete(job)
    await collector.refresh()
    found = samples(observe.exposition(collector, CollectorRegistry()).decode())
    for queue in ("drained", "idle"):
        assert [depth(found, queue, st) for st in observe.QUEUE_STATES] == [0, 0, 0, 0]


async def test_scrapes_share_one_read_per_max_age(pool: asyncpg.Pool) -> None:
    q = Queue(LeaseClient(pool=pool), "mail")
    await q.enqueue({})
    collector = observe.QueueCollector(LeaseClient(pool=pool), max_age=3600)
    await asyncio.gather(*(collector.refresh() for _ in range(20)))
    await collector.refresh()
    assert collector.reads == 1
    await q.enqueue({})  # not seen until the cache is older than max_age
    await collector.refresh()
    assert collector.depths["mail"].jobs == {"queued": 1}
    fresh = observe.QueueCollector(LeaseClient(pool=pool), max_age=0)
    await fresh.refresh()
    await fresh.refresh()
    assert fresh.reads == 2 and fresh.depths["mail"].jobs == {"queued": 2}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_unreachable_database_reads_as_down_not_as_an_error() -> None:
    client = LeaseClient(f"postgresql://nobody@127.0.0.1:{_closed_port()}/none")
    collector = observe.QueueCollector(client)
    await collector.refresh()
    found = samples(observe.exposition(collector, CollectorRegistry()).decode())
    assert found == {("fencegate_database_up", ()): 0}
    await client.close()


async def test_serve_without_a_client_shows_the_registry_only() -> None:
    registry = CollectorRegistry()
    Counter("fencegate_test_things_total", "Things.", registry=registry).inc(3)
    server = await observe.serve(0, host="127.0.0.1", registry=registry)
    try:
        found = await scrape(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        await server.close()
    assert found == {("fencegate_test_things_total", ()): 3}


async def test_a_worker_serves_its_counters_and_the_queue_gauges(pool: asyncpg.Pool) -> None:
    q = Queue(LeaseClient(pool=pool, owner="observed"), "observed")
    await q.enqueue({"n": 1})
    await Queue(LeaseClient(pool=pool), "elsewhere").enqueue({"n": 2})
    done = asyncio.Event()

    async def handle(job: Job) -> None:
        done.set()

    worker = Worker(q, handle, poll_min=0.01, poll_max=0.05, metrics_port=0,
                    metrics_host="127.0.0.1")
    task = asyncio.create_task(worker.run())
    await done.wait()
    while (await q.stats()).get("claimed"):  # the completion is written after the handler
        await asyncio.sleep(0.01)
    assert worker.metrics is not None
    url = f"http://127.0.0.1:{worker.metrics.port}/metrics"
    found = await scrape(url)
    worker.stop()
    await task
    # this process's counters: the worker's claim and completion
    for event in ("claimed", "completed"):
        assert found[("fencegate_jobs_total", (("event", event), ("queue", "observed")))] >= 1
    # the database's view: every queue, not only the worker's
    # series that start at zero, so that increase() sees their first step
    assert ("fencegate_jobs_total", (("event", "dead"), ("queue", "observed"))) in found
    assert ("fencegate_lease_renewals_total", (("result", "lost"),)) in found
    assert depth(found, "observed", "queued") == 0
    assert depth(found, "elsewhere", "queued") == 1
    assert found[("fencegate_database_up", ())] == 1
    with pytest.raises(aiohttp.ClientConnectionError):  # closed with the worker
        await scrape(url)


async def test_the_gateway_metrics_carry_the_queue_gauges(gw: Gw) -> None:
    await Queue(gw.leases, "outbox").enqueue({"n": 1})
    status, _headers, body = await gw.request("GET", "/metrics", {})
    assert status == 200
    found = samples(body.decode() if isinstance(body, bytes) else str(body))
    assert depth(found, "outbox", "queued") == 1
    assert found[("fencegate_database_up", ())] == 1
    # every provider's rejection series exists from the start, so that
    # increase() sees the first one (the alert rules depend on it)
    for provider in ("mail", "crm"):
        assert ("fencegate_fence_rejections_total",
                (("provider", provider), ("reason", "stale_fence"))) in found
