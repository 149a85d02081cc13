"""Overload is answered as overload (issue 17): refused at once, 503
`overloaded`, nothing sent; never called a database outage; and a worker's
own busy pool never costs it its lease."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from gateway.dev.sinks import WebhookSink
from leases import Busy, LeaseClient, LeaseLost
from tests.integration.conftest import Gw
from tests.support.served import serve_gateway
from tests.support.waiting import GENEROUS_SECONDS, until


async def _serve(tmp_path: Path, dsn: str, sink: WebhookSink, *, pool_size: int,
                 in_flight: int) -> tuple[subprocess.Popen[bytes], str]:
    return await serve_gateway(tmp_path, dsn, f"""
[providers.hook]
kind = "http"
base_url = "http://127.0.0.1:{sink.port}/hook"
rate_limit_per_second = 100000
idempotency_header = ""
""", server=f"max_requests_in_flight = {in_flight}",
                               database=f"pool_size = {pool_size}")


async def test_many_callers_against_a_small_gateway_get_200_or_overloaded(
    dsn: str, tmp_path: Path, pool: asyncpg.Pool,
) -> None:
    """200 callers at once against one gateway process with two database
    connections and room for 8 requests: every answer is 200 or 503
    overloaded, none 'unavailable' (the database is fine), every 200 landed
    once, and nothing refused reached the provider."""
    sink = await WebhookSink().start()
    sink.delay = 0.05
    proc, url = await _serve(tmp_path, dsn, sink, pool_size=2, in_flight=8)
    try:
        leases = [await LeaseClient(pool=pool, owner="w").claim(f"run:{i}", ttl=120)
                  for i in range(16)]
        answers: list[tuple[str, int, str]] = []
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0)) as http:
            async def call(i: int) -> None:
                lease = leases[i % len(leases)]
                assert lease is not None
                key = f"k-{i}"
                async with http.post(url + "/v1/http/hook/x", json={"i": i}, headers={
                        "Authorization": "Bearer k", "Fence-Resource": lease.resource,
                        "Fence-Token": str(lease.fence), "Idempotency-Key": key}) as r:
                    await r.read()
                    answers.append((key, r.status, r.headers.get("Fencegate-Problem", "")))

            await asyncio.gather(*(call(i) for i in range(200)))
            async with http.get(url + "/metrics") as r:
                metrics = await r.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(GENEROUS_SECONDS)
        await sink.close()
    kinds = Counter((status, code) for _, status, code in answers)
    assert set(kinds) <= {(200, ""), (503, "overloaded")}, kinds
    assert kinds[(200, "")] and kinds[(503, "overloaded")], kinds
    delivered = Counter(f"k-{json.loads(d.body)['i']}" for d in sink.deliveries)
    for key, status, _ in answers:
        assert delivered[key] == (1 if status == 200 else 0), key
    refused = [ln for ln in metrics.splitlines()
               if ln.startswith('fencegate_requests_refused_total{reason="in_flight"}')]
    assert refused and float(refused[0].rsplit(" ", 1)[1]) == kinds[(503, "overloaded")]
    assert "fencegate_db_unavailable_total 0.0" in metrics


async def test_a_busy_database_pool_is_overload_not_an_outage(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """Both of the gateway's database connections are held by admissions
    waiting on a locked lease row; requests for other resources wait for a
    connection. That used to end after the database timeout as 503
    'unavailable', and 'database unreachable' in the log: it is 503
    overloaded within about a second, and the unavailable count stays."""
    # a database timeout far from the pool's wait (1 s): which one ended
    # the wait shows on any machine
    gw = await make_gw(database={"pool_size": 2}, database_timeout_seconds=30)
    hot = await gw.leases.claim("run:hot", ttl=60)
    others = [await gw.leases.claim(f"run:o{i}", ttl=60) for i in range(4)]
    assert hot is not None and all(others)
    before = await gw.metric("fencegate_db_unavailable_total")
    locker = await gw.pool.acquire()
    tx = locker.transaction()
    await tx.start()
    await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = 'run:hot' "
                         "FOR UPDATE")
    try:
        held = [asyncio.create_task(gw.request("POST", "/v1/http/hook/x",
                                               gw.headers(hot, f"hot-{i}"), json={}))
                for i in range(2)]
        # both connections now wait on the lock
        await until(lambda: gw.pool.fetchval(
            "SELECT count(*) >= 2 FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> $1", locker.get_server_pid()),
            "both gateway connections waiting on the row lock")
        started = asyncio.get_running_loop().time()
        answers = await asyncio.gather(*(
            gw.request("POST", "/v1/http/hook/x", gw.headers(o, f"other-{i}"), json={})
            for i, o in enumerate(others)))
        waited = asyncio.get_running_loop().time() - started
    finally:
        await tx.rollback()
        await gw.pool.release(locker)
    assert [(a[0], a[2]["code"]) for a in answers] == [(503, "overloaded")] * len(others)
    assert all(int(a[1]["Retry-After"]) >= 1 for a in answers)
    assert waited < 15, f"refused only after {waited:.1f} s: the database timeout, not the pool's"
    assert [(await h)[0] for h in held] == [200, 200]  # the lock went, they went through
    assert await gw.metric("fencegate_db_unavailable_total") == before
    assert await gw.metric("fencegate_requests_refused_total", reason="database_pool") >= 4
    assert len(gw.hook.deliveries) == 2


async def test_a_workers_saturated_pool_does_not_cost_it_its_lease(dsn: str) -> None:
    """Every connection of the worker's pool is busy with the work its
    leases guard; renewals used to queue behind it until the local deadline
    passed, and the lease was lost 'unreachable' though the database was fine.
    Renewals have connections of their own."""
    async with LeaseClient(dsn, owner="w", pool_size=2, acquire_timeout=0.2) as client:
        # renewals every 2 s; only a stall of 2.8 s loses it, the pool aside
        lease = await client.claim("run:1", ttl=6.0)
        assert lease is not None
        pool = await client.connect()
        busy = [await pool.acquire() for _ in range(2)]  # the work holds them all
        try:
            with pytest.raises(Busy):
                await client.fetchrow("show_lease", "run:1")
            async with lease:
                for n in range(2):  # two renewals while the pool stays full
                    seen = lease.expires_at
                    await until(lambda seen=seen: lease.expires_at > seen,  # type: ignore[misc]
                                f"renewal {n + 1} through the busy pool")
            assert lease.lost is None
        except LeaseLost as lost:
            raise AssertionError(f"lost the lease to a busy pool: {lost}") from None
        finally:
            for conn in busy:
                await pool.release(conn)


def test_the_in_flight_bound_has_a_default_from_the_pool() -> None:
    from gateway import config

    base = {"clients": [], "providers": {}}
    assert config.parse(base).max_requests_in_flight == 20 * config.REQUESTS_PER_CONNECTION
    small = config.parse({**base, "database": {"pool_size": 3}})
    assert small.max_requests_in_flight == 3 * config.REQUESTS_PER_CONNECTION
    fixed = config.parse({**base, "server": {"max_requests_in_flight": 7}})
    assert fixed.max_requests_in_flight == 7
    assert sys.version_info >= (3, 11)


async def test_one_clients_slow_bodies_do_not_refuse_another_client(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """Client ``other`` holds as many unfinished bodies as the gateway has
    room for requests (each past its headers, the server reading its body:
    it has answered ``100 Continue``). A slot is counted once the body has
    arrived, the body deadline bounding the wait, so ``agents``' claims still
    go through: they used to answer 503 overloaded until ``other``'s bodies
    timed out."""
    from urllib.parse import urlsplit

    from tests.integration.conftest import API_KEY, OTHER_KEY

    room = 4
    gw = await make_gw(max_requests_in_flight=room, body_timeout_seconds=60)
    url = urlsplit(gw.url)
    assert url.hostname is not None and url.port is not None
    held = []
    try:
        for i in range(room):
            reader, writer = await asyncio.open_connection(url.hostname, url.port)
            held.append(writer)
            writer.write((f"POST /v1/leases/claim HTTP/1.1\r\nHost: gw\r\n"
                          f"Authorization: Bearer {OTHER_KEY}\r\n"
                          "Content-Type: application/json\r\nContent-Length: 200\r\n"
                          "Expect: 100-continue\r\n\r\n").encode())
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100"), i
            writer.write(b'{"resource": "other:%d", ' % i)  # and no more
            await writer.drain()
        answers = [await gw.post("/v1/leases/claim", {"Authorization": f"Bearer {API_KEY}"},
                                 json={"resource": f"run:{i}", "ttl_seconds": 30})
                   for i in range(5)]
    finally:
        for writer in held:
            writer.close()
    assert [(status, body.get("code")) for status, _, body in answers] == [(200, None)] * 5
