"""An SMTP attempt that times out resets its connection, in the serving process.

``fencegate serve`` runs on uvloop, whose transports are not
``asyncio.Transport`` instances (so ``_Connection.close``'s own abort does
not apply there, and aiosmtplib's ``transport.close()`` runs). The SMTP
provider's own timeout (and aiosmtplib's) usually comes before the attempt's
deadline: the connection is closed there, the attempt ends, and its write
gate's deadline timer is cancelled with it. That close must drop what the
process still holds: a close that went on writing the rest of the message,
at whatever pace the provider reads, after the drain barrier opened and
fence F+1 was granted, would have the provider accept fence F's message.
(uvloop's close cancels what libuv still queues, and SO_LINGER 0 resets.)
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from leases import LeaseClient
from tests.support.drain import FAST_TOML, claim_after_barrier
from tests.support.heldsmtp import HeldSmtp
from tests.support.served import serve_gateway


@pytest.fixture
async def held_smtp() -> AsyncIterator[HeldSmtp]:
    server = await HeldSmtp().start()
    yield server
    await server.close()


async def _serve(tmp_path: Path, dsn: str, smtp_port: int) -> tuple[subprocess.Popen[bytes],
                                                                     str]:
    return await serve_gateway(tmp_path, dsn, f"""
[providers.mail]
kind = "smtp"
host = "127.0.0.1"
port = {smtp_port}
timeout_seconds = 1
rate_limit_per_second = 1000
""", server=FAST_TOML)


async def test_an_smtp_message_cut_by_its_timeout_is_not_accepted_after_the_barrier(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path, held_smtp: HeldSmtp,
) -> None:
    """The server stops reading after its 354; the 400 kB message fills its
    window and the gateway's kernel, the rest waits in the gateway process.
    The SMTP timeout ends the attempt (504). Once F+1 is granted the server
    reads again: it must never get fence F's message whole."""
    proc, url = await _serve(tmp_path, dsn, held_smtp.port)
    try:
        lease = await LeaseClient(pool=pool, owner="worker-a").claim("run:A", ttl=60)
        assert lease is not None
        headers = {"Authorization": "Bearer k", "Fence-Resource": lease.resource,
                   "Fence-Token": str(lease.fence), "Idempotency-Key": "held-mail-1"}
        content = base64.b64encode(b"a" * 300_000).decode()
        async with aiohttp.ClientSession() as http, http.post(url + "/v1/email", json={
                "from": "a@example.com", "to": ["b@example.com"], "subject": "s",
                "text": "t", "attachments": [{"filename": "big.bin", "content": content,
                                              "content_type": "application/pdf"}]},
                headers=headers) as r:
            body = await r.json()
            assert r.status == 504 and body["code"] == "provider_timeout", (r.status, body)
        await claim_after_barrier(pool, "run:A")
        held_smtp.release()  # the server reads again, at full speed
        [conn] = held_smtp.conns
        await conn.ended.wait()
        assert held_smtp.accepted == [], "fence F's message was accepted after F+1"
    finally:
        proc.kill()
        proc.wait()
