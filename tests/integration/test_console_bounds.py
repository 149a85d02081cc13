"""The console's forms are bounded like every other route, and its login is
throttled (issue 22, items 7 and 9).

``/console/login`` and ``/console/logout`` take no API key, so they must not
hold a connection past ``body_timeout_seconds`` nor read more than a form
needs (a login is a few hundred bytes): a slow body is 408, a large one 413,
before anything is parsed. Failed logins are throttled per source address
and overall; the throttle is a pure policy (gateway/console/throttle.py)
whose clock the tests set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from gateway import config as gconfig
from gateway.api.auth import key_sha256
from gateway.app import build_app
from gateway.dev.sinks import SmtpSink, WebhookSink
from tests.integration.conftest import _base_config

OPERATOR_KEY = "test-key-operator-bounds"
#: a hang guard only: the answer is expected after body_timeout_seconds
GUARD_SECONDS = 30


@dataclass
class Site:
    url: str
    server: TestServer
    http: aiohttp.ClientSession

    async def login(self, key: str) -> tuple[int, dict[str, str], str]:
        async with self.http.post(self.url + "/console/login", data={"api_key": key},
                                  headers={"Origin": self.url}, allow_redirects=False) as r:
            return r.status, dict(r.headers), await r.text()

    async def raw(self, head: str, body: bytes = b"", *, wait_continue: bool = False,
                  ) -> bytes:
        """Send a request's head (and ``body``) on a fresh connection and read
        the answer to its end; with ``wait_continue``, the body goes after
        the server's ``100 Continue`` (it is then reading the body)."""
        url = urlsplit(self.url)
        assert url.hostname is not None and url.port is not None
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        try:
            writer.write(head.encode())
            if wait_continue:
                line = await reader.readuntil(b"\r\n\r\n")
                assert line.startswith(b"HTTP/1.1 100"), line
            writer.write(body)
            await writer.drain()
            async with asyncio.timeout(GUARD_SECONDS):
                return await reader.read()
        finally:
            writer.close()


@pytest.fixture
async def site(dsn: str, pool: asyncpg.Pool, smtp_sink: SmtpSink,
               webhook_sink: WebhookSink) -> AsyncIterator[Site]:
    data = _base_config(smtp_sink.port, webhook_sink.port, {"body_timeout_seconds": 0.5})
    data["clients"].append({"name": "ops", "key_sha256": key_sha256(OPERATOR_KEY),
                            "resources": ["run:*"], "role": "operator"})
    app = build_app(gconfig.parse(data, "test.toml"), dsn, migrate_on_start=False)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    yield Site(str(server.make_url("")).rstrip("/"), server, http)
    await http.close()
    await server.close()


def _head(site: Site, path: str, length: int | None, *, expect: bool = False) -> str:
    host = urlsplit(site.url).netloc
    sized = f"Content-Length: {length}\r\n" if length is not None else \
        "Transfer-Encoding: chunked\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: {site.url}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n" + sized +
            ("Expect: 100-continue\r\n" if expect else "") + "Connection: close\r\n\r\n")


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("path", ["/console/login", "/console/logout"])
async def test_a_slow_console_form_is_cut_at_the_body_deadline(site: Site, path: str) -> None:
    answer = await site.raw(_head(site, path, 300, expect=True), b"api_key=abc",
                            wait_continue=True)
    assert _status(answer) == 408, answer[:200]
    assert b"request_timeout" in answer


@pytest.mark.parametrize("path", ["/console/login", "/console/logout"])
async def test_a_large_console_form_is_refused_before_it_is_read(site: Site, path: str) -> None:
    """16 KiB is far more than a login form (a key, a CSRF token) and far
    less than max_body_bytes (64 KiB here): refused 413, declared or chunked."""
    body = b"api_key=" + b"k" * (16 * 1024)
    answer = await site.raw(_head(site, path, len(body)), body)
    assert (_status(answer), b"payload_too_large" in answer) == (413, True), answer[:200]
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    answer = await site.raw(_head(site, path, None), chunked)
    assert (_status(answer), b"payload_too_large" in answer) == (413, True), answer[:200]


async def test_a_login_form_of_ordinary_size_still_logs_in(site: Site) -> None:
    status, headers, _ = await site.login(OPERATOR_KEY)
    assert (status, headers.get("Location")) == (303, "/console")


async def test_failed_logins_are_throttled_per_source(
        site: Site, caplog: pytest.LogCaptureFixture) -> None:
    from gateway.console.throttle import PER_SOURCE_FAILURES, THROTTLE_KEY

    throttle = site.server.app[THROTTLE_KEY]
    now = [1000.0]
    throttle.clock = lambda: now[0]  # the clock stands still: the throttle stays on
    caplog.set_level(logging.INFO, logger="fencegate.console")
    for i in range(PER_SOURCE_FAILURES):
        status, _, _ = await site.login(f"wrong-{i}")
        assert status == 403, i
    status, headers, _ = await site.login("wrong-again")
    assert status == 429 and int(headers["Retry-After"]) >= 1
    # while it is on, even the right key is refused, unread: no oracle
    status, headers, _ = await site.login(OPERATOR_KEY)
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert any("throttled" in r.getMessage() for r in caplog.records)
    assert all("wrong-" not in r.getMessage() and OPERATOR_KEY not in r.getMessage()
               and "wrong-" not in str(r.__dict__) for r in caplog.records)
    now[0] += int(headers["Retry-After"]) + 1  # past the window
    status, headers, _ = await site.login(OPERATOR_KEY)
    assert (status, headers.get("Location")) == (303, "/console")
