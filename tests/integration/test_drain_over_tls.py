"""The drain barrier on the wire, over TLS.

An SMTP provider over implicit TLS or STARTTLS is reached through an
``SSLProtocol`` stacked on the socket's transport: the gate wraps the TLS
transport (what aiosmtplib writes to), and the reset must still reach the
socket beneath. A message cut in DATA at the attempt's deadline leaves
nothing behind: the link's connection is reset, and the provider never
accepts fence F's message after F+1 was granted.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import trustme

from gateway.dev.sinks import SmtpSink
from gateway.idempotency import message_id
from leases import LeaseClient
from tests.integration.conftest import Gw
from tests.integration.test_drain_on_the_wire import FAST, RATE, _claim_after
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
        lease = await gw.leases.claim("run:A", ttl=1)
        assert lease is not None
        content = base64.b64encode(b"a" * 300_000).decode()
        status, _, body = await gw.email(lease, "mail-tls-1", body={"attachments": [
            {"filename": "big.bin", "content": content, "content_type": "application/pdf"}]})
        assert status in (504, 503), body
        await _claim_after(LeaseClient(pool=gw.pool, owner="worker-b"), "run:A")
        [conn] = link.conns
        await conn.ended.wait()
        await conn.settled.wait()
        mine = [d for d in sink.deliveries
                if d.header("Message-ID") == message_id("agents", "mail-tls-1")]
        assert mine == [], "fence F's message was accepted after F+1 was granted"
        assert conn.ending == "reset", "the TLS connection was closed, not reset"
    finally:
        await link.close()
