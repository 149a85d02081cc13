"""The drain barrier on the wire, over TLS and on reused connections.

An SMTP provider over implicit TLS or STARTTLS, and an HTTPS provider, are
reached through an ``SSLProtocol`` stacked on the socket's transport: the
gate wraps the TLS transport (what aiosmtplib and aiohttp write to), and the
reset must still reach the socket beneath. A pooled keep-alive connection
that a later attempt reuses must be under that attempt's gate. Either way an
attempt cut at its deadline leaves nothing behind: the link's connection is
reset, and the provider never gets fence F's request after F+1 was granted.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web

from gateway.dev.sinks import SmtpSink, WebhookSink
from gateway.effects.fingerprint import message_id
from tests.integration.conftest import Gw
from tests.support.drain import FAST, RATE, claim_after_barrier
from tests.support.slowlink import SlowLink


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _server_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


@pytest.fixture(params=["tls", "starttls"])
async def tls_sink(request: pytest.FixtureRequest,
                   ca: trustme.CA) -> AsyncIterator[tuple[str, SmtpSink]]:
    ctx = _server_context(ca)
    tls: str = request.param
    sink = await SmtpSink(starttls=ctx if tls == "starttls" else None,
                          implicit_tls=ctx if tls == "tls" else None).start()
    yield tls, sink
    await sink.close()


async def test_an_smtp_message_over_tls_cut_in_data_is_never_accepted_later(
    make_gw: Callable[..., Awaitable[Gw]], tls_sink: tuple[str, SmtpSink],
    ca: trustme.CA, tmp_path: Path,
) -> None:
    """A 300 kB attachment over a 64 kB/s link, over TLS, times out in DATA;
    F+1 is granted once the barrier opens; the link's connection was reset
    (not closed) and the provider never gets fence F's message."""
    tls, sink = tls_sink
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    link = await SlowLink(sink.port, rate=RATE, slow_connections=1).start()
    try:
        gw = await make_gw(providers={"mail": {
            "port": link.port, "timeout_seconds": 1, "tls": tls, "ca_file": str(ca_file)}},
            **FAST)
        lease = await gw.leases.claim("run:A", ttl=60)
        assert lease is not None
        content = base64.b64encode(b"a" * 300_000).decode()
        status, _, body = await gw.email(lease, "mail-tls-1", body={"attachments": [
            {"filename": "big.bin", "content": content, "content_type": "application/pdf"}]})
        assert status in (504, 503), body
        await claim_after_barrier(gw.pool, "run:A")
        [conn] = link.conns
        await conn.ended.wait()
        await conn.settled.wait()
        mine = [d for d in sink.deliveries
                if d.header("Message-ID") == message_id("agents", "mail-tls-1")]
        assert mine == [], "fence F's message was accepted after F+1 was granted"
        assert conn.ending == "reset", "the TLS connection was closed, not reset"
    finally:
        await link.close()


class _TlsWebhookSink(WebhookSink):
    """The webhook sink, served over TLS."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        super().__init__()
        self.ctx = ctx

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> WebhookSink:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, ssl_context=self.ctx).start()
        self.port = self._runner.addresses[0][1]
        return self


@pytest.fixture(params=["http", "https"])
async def hook_sink(request: pytest.FixtureRequest, ca: trustme.CA,
                    webhook_sink: WebhookSink) -> AsyncIterator[tuple[str, WebhookSink]]:
    if request.param == "http":
        yield "http", webhook_sink
        return
    # HTTP providers trust the system's CAs (no ca_file): add the test CA to
    # the context aiohttp verifies with, for this process
    ca.configure_trust(aiohttp.connector._SSL_CONTEXT_VERIFIED)
    sink = await _TlsWebhookSink(_server_context(ca)).start()
    yield "https", sink
    await sink.close()


async def test_a_reused_connection_that_timed_out_leaves_nothing_on_the_wire(
    make_gw: Callable[..., Awaitable[Gw]], hook_sink: tuple[str, WebhookSink],
) -> None:
    """A small request opens a keep-alive connection through a 64 kB/s link
    (over TLS, or not) and is answered; a 400 kB request of another lease
    reuses it (the pool), times out (504), and is cut by its own attempt's
    gate: the connection is reset, and once F+1 is granted the provider never
    gets fence F's request."""
    scheme, sink = hook_sink
    link = await SlowLink(sink.port, rate=RATE, slow_connections=1).start()
    try:
        gw = await make_gw(providers={"linkhook": {
            "kind": "http", "base_url": f"{scheme}://127.0.0.1:{link.port}/hook",
            "timeout_seconds": 1, "rate_limit_per_second": 1000, "idempotency_header": ""}},
            **FAST)
        warm = await gw.leases.claim("run:W", ttl=30)
        assert warm is not None
        status, _, body = await gw.post("/v1/http/linkhook/w", gw.headers(warm, "warm-1"),
                                        data=b"w")
        assert status == 200, (status, body)
        lease = await gw.leases.claim("run:A", ttl=60)
        assert lease is not None
        status, _, body = await gw.post("/v1/http/linkhook/x", gw.headers(lease, "big-1"),
                                        data=b"x" * 400_000)
        assert status == 504 and body["code"] == "provider_timeout", (status, body)
        await claim_after_barrier(gw.pool, "run:A")
        [conn] = link.conns  # one connection: the big request reused it
        await conn.ended.wait()
        await conn.settled.wait()
        late = [d for d in sink.deliveries if d.headers.get("Fence-Token") == str(lease.fence)]
        assert late == [], "fence F's request reached the provider after F+1"
        assert conn.ending == "reset", "the connection was closed, not reset"
    finally:
        await link.close()
