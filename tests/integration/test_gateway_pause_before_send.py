"""The drain barrier holds against a gateway process that is paused between
its last deadline check and the bytes leaving for the provider: fence F's
request never reaches the provider after fence F+1 was granted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import build_app
from gateway.dev.sinks import WebhookSink
from gateway.providers import ProviderCall
from gateway.providers import http as http_provider
from leases import LeaseClient
from tests.integration.conftest import API_KEY, gateway_config
from tests.support.lapse import lapse
from tests.support.waiting import GENEROUS_SECONDS

#: a stop-the-world pause of the gateway process (SIGSTOP, a VM freeze, swap,
#: a CFS throttle): longer than the database timeout + provider timeout +
#: barrier_grace_seconds of this configuration (0.1 + 1.0 + 2.0), and shorter
#: than the provider connection's keep-alive (4 s)
PAUSE_SECONDS = 3.7


class ThreadedSink:
    """A WebhookSink on its own event loop in its own thread: a provider on
    another machine keeps reading while the gateway's process is paused."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.sink = WebhookSink()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> ThreadedSink:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.sink.start(), self.loop).result(10)
        return self

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.sink.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def provider() -> Iterator[ThreadedSink]:
    s = ThreadedSink().start()
    yield s
    s.close()


@pytest.fixture
async def gateway_url(dsn: str, provider: ThreadedSink) -> AsyncIterator[str]:
    app = build_app(gateway_config(1, provider.sink.port, database_timeout_seconds=0.1),
                    dsn, migrate_on_start=False)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


def _headers(resource: str, fence: int, key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}", "Fence-Resource": resource,
            "Fence-Token": str(fence), "Idempotency-Key": key}


async def test_a_pause_after_the_last_deadline_check_never_lands_fence_f_after_f_plus_1(
    gateway_url: str, provider: ThreadedSink, dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole gateway process stops (here for ``PAUSE_SECONDS``) after its
    last deadline check and before the request is written, on a reused
    keep-alive connection, while another worker keeps claiming the resource:
    once fence F+1 is granted, no byte of fence F's request reaches the
    provider."""
    leases = LeaseClient(dsn, owner="worker-a")
    async with aiohttp.ClientSession() as http:
        warm = await leases.claim("run:warm", ttl=30)
        assert warm is not None
        # an earlier effect leaves a keep-alive connection to the provider (4 s)
        async with http.post(gateway_url + "/v1/http/hook/x", json={},
                             headers=_headers("run:warm", warm.fence, "warm-up")) as r:
            assert r.status == 200

        original = http_provider.HttpProvider.headers

        def headers_then_pause(self: http_provider.HttpProvider,
                               call: ProviderCall) -> dict[str, str]:
            out = original(self, call)
            if call.key == "paused":
                time.sleep(PAUSE_SECONDS)  # the whole gateway process stops here
            return out

        monkeypatch.setattr(http_provider.HttpProvider, "headers", headers_then_pause)

        lease_a = await leases.claim("run:1", ttl=30)
        assert lease_a is not None
        won: list[tuple[float, int]] = []

        def worker_b() -> None:  # another machine: keeps claiming run:1 until it wins
            async def claim() -> None:
                async with LeaseClient(dsn, owner="worker-b") as b:
                    end = time.monotonic() + GENEROUS_SECONDS
                    watch = await asyncpg.connect(dsn)
                    try:  # A's effect is admitted; then A's lease runs out
                        while not await watch.fetchval(
                                "SELECT count(*) FROM fencegate_effects "
                                "WHERE idempotency_key = 'paused'"):
                            assert time.monotonic() < end, "A's effect was never admitted"
                            await asyncio.sleep(0.02)
                        await lapse(watch, "run:1")
                    finally:
                        await watch.close()
                    while time.monotonic() < end:
                        got = await b.claim("run:1", ttl=30)
                        if got is not None:
                            won.append((time.monotonic(), got.fence))
                            return
                        await asyncio.sleep(0.02)
            asyncio.run(claim())

        thread = threading.Thread(target=worker_b)
        thread.start()
        try:
            async with http.post(gateway_url + "/v1/http/hook/x", json={},
                                 headers=_headers("run:1", lease_a.fence, "paused")) as r:
                status, body = r.status, await r.text()
        finally:
            thread.join()
    await leases.close()
    await asyncio.sleep(0.5)  # let the provider finish reading what reached it
    assert won, "worker-b never won run:1"
    won_at, fence_b = won[0]
    assert fence_b > lease_a.fence
    late = [d for d in list(provider.sink.deliveries)
            if d.header("Fence-Token") == str(lease_a.fence) and d.received_at > won_at]
    assert not late, (
        f"fence {lease_a.fence}'s effect reached the provider "
        f"{late[0].received_at - won_at:.2f}s after fence {fence_b} was granted "
        f"(the gateway answered {status}: {body})")
