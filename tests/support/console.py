"""The operators' console on a real gateway: a config with an operator
client, a cookie-keeping session around the running app, and an effect that
reads unknown for its screens to show."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
from aiohttp.test_utils import TestServer

from gateway import config as gconfig
from gateway.api.auth import key_sha256
from gateway.app import build_app
from gateway.dev.sinks import SmtpSink, WebhookSink
from gateway.state import GATEWAY
from tests.integration.conftest import _base_config

OPERATOR_KEY = "test-key-operator"


def console_config(smtp_port: int, http_port: int) -> gconfig.Config:
    data = _base_config(smtp_port, http_port, {})
    data["clients"].append({"name": "ops", "key_sha256": key_sha256(OPERATOR_KEY),
                            "resources": ["run:*"], "role": "operator"})
    return gconfig.parse(data, "test.toml")


@dataclass
class Console:
    url: str
    server: TestServer
    http: aiohttp.ClientSession  # a browser: keeps cookies
    pool: asyncpg.Pool

    async def login(self, key: str = OPERATOR_KEY) -> aiohttp.ClientResponse:
        async with self.http.post(self.url + "/console/login", data={"api_key": key},
                                  headers={"Origin": self.url}, allow_redirects=False) as r:
            await r.read()
            return r

    async def page(self, path: str) -> tuple[int, str, dict[str, str]]:
        async with self.http.get(self.url + path) as r:
            return r.status, await r.text(), dict(r.headers)

    async def csrf(self) -> str:
        _, html, _ = await self.page("/console/leases")
        found = re.search(r'name="csrf" value="([^"]+)"', html)
        assert found is not None
        return found.group(1)

    async def post(self, path: str, data: dict[str, str], origin: str | None = None,
                   ) -> tuple[int, str]:
        async with self.http.post(self.url + path, data=data, allow_redirects=False,
                                  headers={"Origin": origin or self.url}) as r:
            return r.status, r.headers.get("Location", "")

    @property
    def gateway(self) -> Any:
        return self.server.app[GATEWAY]


@contextlib.asynccontextmanager
async def open_console(dsn: str, pool: asyncpg.Pool, smtp_sink: SmtpSink,
                       webhook_sink: WebhookSink) -> AsyncIterator[Console]:
    """A gateway with an operator client, and a cookie-keeping HTTP session."""
    app = build_app(console_config(smtp_sink.port, webhook_sink.port), dsn,
                    migrate_on_start=False)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    try:
        yield Console(str(server.make_url("")).rstrip("/"), server, http, pool)
    finally:
        await http.close()
        await server.close()


async def unknown_effect(pool: asyncpg.Pool, key: str, *, past_deadline: bool) -> None:
    """An effect of client ``agents`` under ``key`` that reads ``unknown``, its
    deadline passed or an hour ahead."""
    await pool.execute("""
        INSERT INTO fencegate_leases (resource, owner, fence, claimed_at, expires_at)
        VALUES ('run:u', 'w', 1, clock_timestamp(), clock_timestamp() + interval '1 hour')
        ON CONFLICT DO NOTHING""")
    verdict = await pool.fetchval(
        "SELECT verdict FROM fencegate_admit_effect('agents', $1, '\\x00'::bytea, "
        "'run:u', 1, 'mail', 7, $2, 0, 5)", key, 0.01 if past_deadline else 600.0)
    assert verdict == "admitted"
    await pool.execute("UPDATE fencegate_effects SET state = 'unknown', "
                       "summary = 'timed out during DATA' WHERE idempotency_key = $1", key)
    if past_deadline:
        await pool.execute("UPDATE fencegate_effects SET deadline = deadline - "
                           "interval '1 hour' WHERE idempotency_key = $1", key)
