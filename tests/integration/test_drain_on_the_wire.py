"""The drain barrier against the network stack (issue 21).

No effect of fence F may reach a provider after fence F+1 was granted, and
one key leads to at most one provider action. The barrier is a time; bytes a
gateway wrote before its deadline used to stay in its kernel's send queue
when the attempt ended without an answer (a graceful close), and TCP
delivered them whenever the path allowed: seconds after the barrier opened.

Each test puts a slow link (tests/support/slowlink.py) between the gateway
and its provider, sends a body the link cannot carry within the attempt's
budget, and checks what reached the provider once the link's connection has
ended: an attempt that ends without a complete answer leaves nothing behind
(its connection is reset, its queue discarded), so the provider never sees a
complete fence-F request, before or after F+1. The link's rate is an upper
bound: a busy machine only makes it slower, which changes nothing here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from gateway.dev.sinks import SmtpSink, WebhookSink
from gateway.effects.fingerprint import message_id
from leases import Lease, LeaseClient
from tests.integration.conftest import Gw
from tests.support.drain import FAST, FAST_TOML, RATE, claim_after_barrier
from tests.support.served import serve_gateway
from tests.support.slowlink import SlowLink
from tests.support.waiting import until

BODY_BYTES = 400_000


@pytest.fixture
async def http_link(webhook_sink: WebhookSink) -> AsyncIterator[SlowLink]:
    link = await SlowLink(webhook_sink.port, rate=RATE, slow_connections=1).start()
    yield link
    await link.close()


@pytest.fixture
async def smtp_link(smtp_sink: SmtpSink) -> AsyncIterator[SlowLink]:
    link = await SlowLink(smtp_sink.port, rate=RATE, slow_connections=1).start()
    yield link
    await link.close()


def _slow_hook(link: SlowLink) -> dict[str, dict[str, object]]:
    return {"slowhook": {"kind": "http", "base_url": f"http://127.0.0.1:{link.port}/hook",
                         "timeout_seconds": 1, "rate_limit_per_second": 1000,
                         "idempotency_header": ""}}


def _fence_f(gw: Gw, lease: Lease) -> list[object]:
    return [d for d in gw.hook.deliveries
            if d.headers.get("Fence-Token") == str(lease.fence)
            and d.headers.get("Fence-Resource") == lease.resource]


async def test_a_timed_out_http_request_leaves_nothing_on_the_wire(
    make_gw: Callable[..., Awaitable[Gw]], http_link: SlowLink,
) -> None:
    """Reproduction 1: a 400 kB request over a 64 kB/s link times out (504).
    F+1 is granted once the barrier opens; the provider must not then
    receive (and act on) the complete fence-F request."""
    gw = await make_gw(providers=_slow_hook(http_link), **FAST)
    lease = await gw.leases.claim("run:A", ttl=60)
    assert lease is not None
    status, _, body = await gw.post("/v1/http/slowhook/x", gw.headers(lease, "big-1"),
                                    data=b"x" * BODY_BYTES)
    assert status == 504 and body["code"] == "provider_timeout", body
    await claim_after_barrier(gw.pool, "run:A")
    await _nothing_after_f1(http_link, gw.hook, lease)


async def test_a_provider_that_stops_reading_gets_nothing_after_the_barrier(
    make_gw: Callable[..., Awaitable[Gw]], http_link: SlowLink,
) -> None:
    """The provider stops reading its socket: the request waits in the
    gateway's kernel, the attempt times out, F+1 is granted. When the
    provider reads again, nothing of fence F's request may be left for it."""
    http_link.set_rate(0)
    gw = await make_gw(providers=_slow_hook(http_link), **FAST)
    lease = await gw.leases.claim("run:A", ttl=60)
    assert lease is not None
    status, _, body = await gw.post("/v1/http/slowhook/x", gw.headers(lease, "stopped-1"),
                                    data=b"x" * BODY_BYTES)
    assert status == 504 and body["code"] == "provider_timeout", body
    await claim_after_barrier(gw.pool, "run:A")
    http_link.set_rate(None)  # the provider reads again, at full speed
    [conn] = http_link.conns
    await conn.ended.wait()
    await conn.settled.wait()
    assert _fence_f(gw, lease) == [], "fence F's request reached the provider after F+1"
    assert conn.ending == "reset"


async def test_a_resolve_cannot_free_a_key_whose_request_is_still_on_the_wire(
    make_gw: Callable[..., Awaitable[Gw]], http_link: SlowLink,
) -> None:
    """Reproduction 4: the 400 kB request times out; an operator resolves it
    `not_sent` as soon as the gateway lets them; the repeat of the key goes
    out on a fresh connection and acts. The first request must not complete
    and act a second time."""
    gw = await make_gw(providers=_slow_hook(http_link), **FAST)
    lease = await gw.leases.claim("run:A", ttl=60)
    assert lease is not None
    status, _, _ = await gw.post("/v1/http/slowhook/x", gw.headers(lease, "big-2"),
                                 data=b"x" * BODY_BYTES)
    assert status == 504
    auth = {"Authorization": gw.headers()["Authorization"]}

    async def resolved() -> bool:  # refused (409, Retry-After) while an attempt may be under way
        status, _, body = await gw.post("/v1/effects/big-2/resolve", auth,
                                        json={"outcome": "not_sent"})
        assert status == 200 or (status, body["code"]) == (409, "effect_in_progress"), body
        return status == 200

    await until(resolved, "the resolve, once the attempt is over", every=0.1)
    status, _, _ = await gw.post("/v1/http/slowhook/x", gw.headers(lease, "big-2"),
                                 data=b"x" * BODY_BYTES)
    assert status == 200  # the repeat, on a fresh connection at full speed
    first = http_link.conns[0]
    await first.ended.wait()
    await first.settled.wait()
    assert len(_fence_f(gw, lease)) == 1, "the key acted twice"


async def test_an_smtp_message_cut_in_data_is_never_accepted_later(
    make_gw: Callable[..., Awaitable[Gw]], smtp_link: SlowLink,
) -> None:
    """Reproduction 2: a message with a 300 kB attachment times out during
    DATA over the slow link. After F+1 is granted, the SMTP server must not
    accept fence F's message."""
    gw = await make_gw(providers={"mail": {"port": smtp_link.port, "timeout_seconds": 1}},
                       **FAST)
    lease = await gw.leases.claim("run:A", ttl=60)
    assert lease is not None
    content = base64.b64encode(b"a" * 300_000).decode()
    status, _, body = await gw.email(lease, "mail-1", body={"attachments": [
        {"filename": "big.bin", "content": content, "content_type": "application/pdf"}]})
    assert status in (504, 503), body
    await claim_after_barrier(gw.pool, "run:A")
    [conn] = smtp_link.conns
    await conn.ended.wait()
    await conn.settled.wait()
    mine = [d for d in gw.smtp.deliveries
            if d.header("Message-ID") == message_id("agents", "mail-1")]
    assert mine == [], "fence F's message was accepted after F+1 was granted"
    assert conn.ending == "reset"


async def _serve(tmp_path: Path, dsn: str, link: SlowLink) -> tuple[subprocess.Popen[bytes],
                                                                     str]:
    """A gateway process (``fencegate serve``) whose provider is behind ``link``."""
    return await serve_gateway(tmp_path, dsn, f"""
[providers.slowhook]
kind = "http"
base_url = "http://127.0.0.1:{link.port}/hook"
timeout_seconds = 2
rate_limit_per_second = 100000
idempotency_header = ""
""", server=FAST_TOML)


async def _under_way(http: aiohttp.ClientSession, url: str, lease: Lease, key: str,
                     link: SlowLink) -> asyncio.Task[aiohttp.ClientResponse]:
    """The big request sent under ``lease`` and ``key``, once its first
    bytes have crossed the link."""
    headers = {"Authorization": "Bearer k", "Fence-Resource": lease.resource,
               "Fence-Token": str(lease.fence), "Idempotency-Key": key}
    sending = asyncio.create_task(
        http.post(url + "/v1/http/slowhook/x", headers=headers, data=b"x" * BODY_BYTES))

    def under_way() -> bool:
        assert not sending.done(), "the request ended before it was under way"
        return bool(link.conns and link.conns[0].forwarded > 0)

    await until(under_way, "the request under way over the link", every=0.01)
    return sending


async def _nothing_after_f1(link: SlowLink, sink: WebhookSink, lease: Lease) -> None:
    """Once the link's connection has ended: none of fence F's request
    reached the provider whole, and its connection was reset."""
    [conn] = link.conns
    await conn.ended.wait()
    await conn.settled.wait()
    late = [d for d in sink.deliveries if d.headers.get("Fence-Token") == str(lease.fence)]
    assert late == [], "the gateway's request reached the provider after F+1"
    assert conn.ending == "reset"
    assert conn.forwarded < BODY_BYTES


async def test_a_gateway_killed_mid_send_leaves_nothing_on_the_wire(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path, http_link: SlowLink, webhook_sink: WebhookSink,
) -> None:
    """Reproduction 3: the gateway process is SIGKILLed while its 400 kB
    request is on its way over the slow link. The kernel closes a dead
    process's sockets: gracefully, it went on delivering the request, and the
    provider acted on fence F after F+1 was granted. Reset, nothing more of
    it arrives."""
    proc, url = await _serve(tmp_path, dsn, http_link)
    try:
        lease = await LeaseClient(pool=pool, owner="worker-a").claim("run:A", ttl=60)
        assert lease is not None
        async with aiohttp.ClientSession() as http:
            sending = await _under_way(http, url, lease, "killed-1", http_link)
            proc.kill()  # SIGKILL, mid-send
            proc.wait()
            with contextlib.suppress(aiohttp.ClientError):
                (await sending).release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    await claim_after_barrier(pool, "run:A")
    await _nothing_after_f1(http_link, webhook_sink, lease)


async def test_a_gateway_stopped_across_its_deadline_completes_nothing_after_f1(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path, http_link: SlowLink, webhook_sink: WebhookSink,
) -> None:
    """The gateway process is SIGSTOPped while its 400 kB request is on its
    way, and stays stopped past its deadline until F+1 is granted ("the one
    assumption": its timer cannot fire). Its kernel goes on sending what it
    holds; on SIGCONT the event loop writes once more before the reset.
    Both are bounded (docs/gateway.md, "The one assumption"): far less than
    the request, so the provider never gets fence F's request whole."""
    proc, url = await _serve(tmp_path, dsn, http_link)
    try:
        lease = await LeaseClient(pool=pool, owner="worker-a").claim("run:A", ttl=60)
        assert lease is not None
        async with aiohttp.ClientSession() as http:
            sending = await _under_way(http, url, lease, "stopped-gw-1", http_link)
            proc.send_signal(signal.SIGSTOP)
            try:
                await claim_after_barrier(pool, "run:A")
            finally:
                proc.send_signal(signal.SIGCONT)
            with contextlib.suppress(aiohttp.ClientError):
                (await sending).release()
    finally:
        proc.kill()
        proc.wait()
    await _nothing_after_f1(http_link, webhook_sink, lease)
