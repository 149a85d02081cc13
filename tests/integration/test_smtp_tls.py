"""SMTP over STARTTLS and implicit TLS, with AUTH, against a real aiosmtpd
server presenting a certificate from a test CA."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import trustme
from aiohttp.test_utils import TestServer

from gateway import config as gconfig
from gateway.api.auth import key_sha256
from gateway.app import build_app
from gateway.dev.sinks import SmtpSink
from leases import LeaseClient
from tests.integration.conftest import API_KEY


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


Send = Callable[[str, str], Awaitable[tuple[int, dict[str, object]]]]


@pytest.fixture
async def send_via(dsn: str, pool: asyncpg.Pool, ca: trustme.CA, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[
                       Callable[[SmtpSink, str, str | None], Awaitable[Send]]]:
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("TEST_SMTP_USER", "mailer")
    servers: list[TestServer] = []
    sessions: list[aiohttp.ClientSession] = []

    async def make(sink: SmtpSink, tls: str, password: str | None) -> Send:
        mail = {"kind": "smtp", "host": "127.0.0.1", "port": sink.port, "tls": tls,
                "ca_file": str(ca_file), "timeout_seconds": 5}
        if password is not None:
            monkeypatch.setenv("TEST_SMTP_PASSWORD", password)
            mail.update(username_env="TEST_SMTP_USER", password_env="TEST_SMTP_PASSWORD")
        cfg = gconfig.parse({
            "clients": [{"name": "agents", "key_sha256": key_sha256(API_KEY),
                         "resources": ["run:*"]}],
            "providers": {"mail": mail},
        })
        server = TestServer(build_app(cfg, dsn, migrate_on_start=False), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        http = aiohttp.ClientSession()
        sessions.append(http)
        lease = await LeaseClient(pool=pool, owner="w").claim("run:tls", ttl=60)
        assert lease is not None

        async def send(key: str, subject: str) -> tuple[int, dict[str, object]]:
            async with http.post(server.make_url("/v1/email"), json={
                    "from": "a@example.com", "to": ["b@example.com"], "subject": subject,
                    "text": "t"}, headers={
                    "Authorization": f"Bearer {API_KEY}", "Fence-Resource": "run:tls",
                    "Fence-Token": str(lease.fence), "Idempotency-Key": key}) as r:
                return r.status, await r.json()

        return send

    yield make
    for http in sessions:
        await http.close()
    for server in servers:
        await server.close()


@pytest.mark.parametrize("tls", ["starttls", "tls"])
async def test_email_over_tls_with_auth(
    send_via: Callable[[SmtpSink, str, str | None], Awaitable[Send]], ca: trustme.CA, tls: str
) -> None:
    ctx = server_context(ca)
    # aiosmtpd offers AUTH only after STARTTLS, so implicit TLS goes without it
    sink = await SmtpSink(starttls=ctx if tls == "starttls" else None,
                          implicit_tls=ctx if tls == "tls" else None,
                          credentials=("mailer", "s3cret") if tls == "starttls" else None
                          ).start()
    try:
        send = await send_via(sink, tls, "s3cret" if tls == "starttls" else None)
        status, body = await send("tls-1", "over TLS")
        assert status == 200, body
        assert [d.header("Subject") for d in sink.deliveries] == ["over TLS"]
    finally:
        await sink.close()


async def test_a_refused_login_sends_nothing_and_leaves_the_key_usable(
    send_via: Callable[[SmtpSink, str, str | None], Awaitable[Send]], ca: trustme.CA
) -> None:
    sink = await SmtpSink(starttls=server_context(ca), credentials=("mailer", "s3cret")).start()
    try:
        send = await send_via(sink, "starttls", "wrong")
        status, body = await send("auth-1", "s")
        assert (status, body["code"]) == (502, "provider_error")
        assert "wrong" not in str(body) and sink.deliveries == []
    finally:
        await sink.close()


async def test_an_untrusted_certificate_is_refused(
    send_via: Callable[[SmtpSink, str, str | None], Awaitable[Send]]
) -> None:
    other = trustme.CA()  # the gateway trusts `ca`, not this one
    sink = await SmtpSink(starttls=server_context(other)).start()
    try:
        send = await send_via(sink, "starttls", "x")
        status, body = await send("cert-1", "s")
        assert (status, body["code"]) == (502, "provider_error")
        assert sink.deliveries == []
    finally:
        await sink.close()
