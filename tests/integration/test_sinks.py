"""The SMTP sink that `fencegate dev` runs and the tests drive: closing it
while a client still holds a connection."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiosmtplib
import pytest
import trustme

from gateway.dev.sinks import SmtpSink


@pytest.mark.parametrize("tls", ["none", "starttls", "tls"])
async def test_close_ends_the_connections_a_client_keeps_open(
    tls: str, tmp_path: Path
) -> None:
    """A client may keep its connection between messages, as the gateway's
    SMTP pool does. Since Python 3.12, ``asyncio.Server.wait_closed()`` waits
    for every accepted connection to end, so a sink that only stopped listening
    waited for its client, and a test that closed the sink before the gateway
    hung until pytest's timeout."""
    ca = trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    sink = await SmtpSink(starttls=ctx if tls == "starttls" else None,
                          implicit_tls=ctx if tls == "tls" else None).start()
    client = aiosmtplib.SMTP(hostname="127.0.0.1", port=sink.port, use_tls=tls == "tls",
                             start_tls=tls == "starttls", cert_bundle=str(ca_file))
    await client.connect()
    try:
        await client.sendmail("a@example.com", ["b@example.com"], b"Subject: one\r\n\r\nx\r\n")
        await sink.close()  # the client is still connected, idle
        with pytest.raises(aiosmtplib.SMTPServerDisconnected):
            await client.noop()
        assert [d.header("Subject") for d in sink.deliveries] == ["one"]
    finally:
        client.close()
