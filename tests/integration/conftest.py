"""A real gateway in front of a real SMTP sink and a real webhook sink, on a
fresh database per test."""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway import config as gconfig
from gateway.api.auth import key_sha256
from gateway.app import build_app
from gateway.state import GATEWAY, Gateway
from leases import Lease, LeaseClient
from tests.support.fake_providers import (
    FakeHubSpot,
    FakeMailgun,
    FakePostmark,
    FakeProvider,
    FakeResend,
    FakeSendGrid,
    FakeSes,
)
from tests.support.sinks import SmtpSink, WebhookSink
from tests.support.waiting import until

API_KEY = "test-key-agents"
SIGNING_SECRET = "whsec_" + base64.b64encode(b"test-signing-secret-32-bytes-ok!").decode()
os.environ.setdefault("FENCEGATE_TEST_SIGNING_SECRET", SIGNING_SECRET)
os.environ.setdefault("FENCEGATE_TEST_CRM_TOKEN", "Bearer crm-secret-token")
OTHER_KEY = "test-key-other"
PEER_KEY = "test-key-peer"  # another client, whose patterns overlap the agents' ones
PROVIDER_TIMEOUT = 1.0
Answer = tuple[int, dict[str, str], Any]  # status, headers, JSON (or raw) body


@pytest.fixture
async def smtp_sink() -> AsyncIterator[SmtpSink]:
    sink = await SmtpSink().start()
    yield sink
    await sink.close()


@pytest.fixture
async def webhook_sink() -> AsyncIterator[WebhookSink]:
    sink = await WebhookSink().start()
    yield sink
    await sink.close()


def gateway_config(smtp_port: int, http_port: int, *,
                   providers: dict[str, dict[str, Any]] | None = None,
                   database: dict[str, Any] | None = None,
                   clients: dict[str, dict[str, Any]] | None = None,
                   **server: Any) -> gconfig.Config:
    """The test gateway's configuration; ``providers`` adds providers or
    changes keys of the standard ones; ``clients`` changes keys of the
    standard clients, by name; ``database`` sets [database] keys."""
    data = _base_config(smtp_port, http_port, server)
    for client in data["clients"]:
        client.update((clients or {}).get(client["name"], {}))
    for name, keys in (providers or {}).items():
        data["providers"].setdefault(name, {}).update(keys)
    if database:
        data["database"] = database
    return gconfig.parse(data, "test.toml")


def _base_config(smtp_port: int, http_port: int, server: dict[str, Any]) -> dict[str, Any]:
    return {
        "server": {"max_body_bytes": 64 * 1024, **server},
        "clients": [
            {"name": "agents", "key_sha256": key_sha256(API_KEY),
             "resources": ["run:*", "lead:*", "job:*"]},
            {"name": "other", "key_sha256": key_sha256(OTHER_KEY), "resources": ["other:*"]},
            {"name": "peer", "key_sha256": key_sha256(PEER_KEY), "resources": ["run:*"]},
        ],
        "providers": {
            "mail": {"kind": "smtp", "host": "127.0.0.1", "port": smtp_port,
                     "timeout_seconds": PROVIDER_TIMEOUT, "rate_limit_per_second": 1000},
            "crm": {"kind": "http", "base_url": f"http://127.0.0.1:{http_port}/api",
                    "timeout_seconds": PROVIDER_TIMEOUT, "rate_limit_per_second": 1000,
                    "idempotency_header": "Idempotency-Key",
                    "idempotency_window_seconds": 86400},
            "hook": {"kind": "http", "base_url": f"http://127.0.0.1:{http_port}/hook",
                     "timeout_seconds": PROVIDER_TIMEOUT, "rate_limit_per_second": 1000,
                     "idempotency_header": ""},
            "signed": {"kind": "http", "base_url": f"http://127.0.0.1:{http_port}/signed",
                       "timeout_seconds": PROVIDER_TIMEOUT, "rate_limit_per_second": 1000,
                       "signing_secret_env": "FENCEGATE_TEST_SIGNING_SECRET",
                       "authorization_env": "FENCEGATE_TEST_CRM_TOKEN"},
            "slowlane": {"kind": "http", "base_url": f"http://127.0.0.1:{http_port}/slow",
                         "timeout_seconds": PROVIDER_TIMEOUT, "rate_limit_per_second": 2,
                         "idempotency_header": ""},
        },
    }


@dataclass
class Gw:
    """A running gateway and what a test needs around it."""

    url: str
    http: aiohttp.ClientSession
    pool: asyncpg.Pool
    leases: LeaseClient
    smtp: SmtpSink
    hook: WebhookSink
    app: web.Application | None = None

    @property
    def gateway(self) -> Gateway:
        """The running gateway's state (test hooks such as ``before_resend``)."""
        assert self.app is not None
        return self.app[GATEWAY]

    def headers(self, lease: Lease | None = None, key: str = "k1", *,
                api_key: str = API_KEY, resource: str | None = None,
                fence: int | str | None = None) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {api_key}",
            "Fence-Resource": resource or (lease.resource if lease else "run:1"),
            "Fence-Token": str(fence if fence is not None else (lease.fence if lease else 1)),
            "Idempotency-Key": key,
        }

    async def post(self, path: str, headers: dict[str, str], **kw: Any) -> Answer:
        return await self.request("POST", path, headers, **kw)

    async def request(self, method: str, path: str, headers: dict[str, str],
                      **kw: Any) -> Answer:
        async with self.http.request(method, self.url + path, headers=headers, **kw) as r:
            body = await r.read()
            try:
                data = await r.json(content_type=None)
            except ValueError:
                data = body
            return r.status, dict(r.headers), data

    async def email(self, lease: Lease | None, key: str = "k1", **over: Any) -> Answer:
        body = {"from": "Agent <agent@example.com>", "to": ["lead@example.com"],
                "subject": "Hello", "text": "Hi there"}
        body.update(over.pop("body", {}))
        return await self.post("/v1/email", self.headers(lease, key, **over), json=body)

    async def past_deadline(self, key: str) -> None:
        """Move an effect's last deadline an hour back, as if that time had
        passed: what an operator waits for before resolving it."""
        await self.pool.execute("UPDATE fencegate_effects SET deadline = deadline - "
                                "interval '1 hour' WHERE idempotency_key = $1", key)

    async def effect_state(self, key: str) -> str | None:
        """The ledger's state of the effect under ``key`` (None: no such row)."""
        state: str | None = await self.pool.fetchval(
            "SELECT state FROM fencegate_effects WHERE idempotency_key = $1", key)
        return state

    async def effect_state_after(self, key: str, leaving: str = "in_flight") -> str | None:
        """The effect's state once it is no longer ``leaving`` (a record
        landing behind the answer), or still that after a generous wait."""
        states: list[str | None] = []

        async def left() -> bool:
            states.append(await self.effect_state(key))
            return states[-1] != leaving

        with contextlib.suppress(AssertionError):  # the caller says what it expected
            await until(left, f"{key} no longer {leaving}")
        return states[-1]

    async def metric(self, name: str, **labels: str) -> float:
        async with self.http.get(self.url + "/metrics") as r:
            text = await r.text()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            metric, _, value = line.rpartition(" ")
            mname, _, mlabels = metric.partition("{")
            got = ",".join(sorted(mlabels.rstrip("}").split(","))) if mlabels else ""
            if mname == name and got == want:
                return float(value)
        return 0.0


@pytest.fixture
async def make_gw(dsn: str, pool: asyncpg.Pool, smtp_sink: SmtpSink,
                  webhook_sink: WebhookSink) -> AsyncIterator[Callable[..., Awaitable[Gw]]]:
    """Start a gateway; ``gateway_dsn`` points it elsewhere (a fault proxy)."""
    servers: list[TestServer] = []
    sessions: list[aiohttp.ClientSession] = []

    async def start(gateway_dsn: str | None = None, *,
                    providers: dict[str, dict[str, Any]] | None = None,
                    database: dict[str, Any] | None = None,
                    clients: dict[str, dict[str, Any]] | None = None, **server: Any) -> Gw:
        config = gateway_config(smtp_sink.port, webhook_sink.port, providers=providers,
                                database=database, clients=clients, **server)
        app = build_app(config, gateway_dsn or dsn, migrate_on_start=False)
        test_server = TestServer(app, host="127.0.0.1")
        await test_server.start_server()
        servers.append(test_server)
        http = aiohttp.ClientSession()
        sessions.append(http)
        return Gw(str(test_server.make_url("")).rstrip("/"), http, pool,
                  LeaseClient(pool=pool, owner="worker-a"), smtp_sink, webhook_sink, app)

    yield start
    for http in sessions:
        await http.close()
    for test_server in servers:
        await test_server.close()


@pytest.fixture
async def gw(make_gw: Callable[..., Awaitable[Gw]]) -> Gw:
    return await make_gw()


# ---- fakes of real providers (presets) ------------------------------------

@pytest.fixture
async def fakes() -> AsyncIterator[dict[str, FakeProvider]]:
    """A fake of every preset's provider on loopback, by preset name, and
    each one's secret in the environment the preset's config names."""
    started: dict[str, FakeProvider] = {}
    for name, fake in (("resend", FakeResend()), ("postmark", FakePostmark()),
                       ("sendgrid", FakeSendGrid()), ("mailgun", FakeMailgun()),
                       ("ses", FakeSes()), ("hubspot", FakeHubSpot())):
        started[name] = await fake.start()
    try:
        yield started
    finally:
        for fake in started.values():
            await fake.close()


def preset_provider(name: str, fake: FakeProvider, **over: Any) -> dict[str, Any]:
    """The provider table that points preset ``name`` at ``fake``."""
    table: dict[str, Any] = {"kind": "http", "preset": name, "base_url": fake.base_url,
                             "timeout_seconds": PROVIDER_TIMEOUT, "rate_limit_per_second": 1000}
    if isinstance(fake, FakeSes):
        table.update(region=fake.region, aws_access_key_id_env=fake.key_id_env,
                     aws_secret_access_key_env=fake.secret_env)
    else:
        table["api_key_env"] = fake.secret_env
    if isinstance(fake, FakeMailgun):
        table["domain"] = fake.domain
    table.update(over)
    return table


async def preset_gateway(make_gw: Callable[..., Awaitable[Gw]],
                         fakes: dict[str, FakeProvider], name: str, **over: Any) -> Gw:
    """A gateway whose provider ``name`` is its preset, pointed at its fake."""
    return await make_gw(providers={name: preset_provider(name, fakes[name], **over)})


async def gateway_with(make_gw: Callable[..., Awaitable[Gw]], fakes: dict[str, FakeProvider],
                       name: str, resource: str = "run:1", **over: Any) -> tuple[Gw, Lease]:
    """``preset_gateway``, and a live lease on ``resource`` to send under."""
    gw = await preset_gateway(make_gw, fakes, name, **over)
    lease = await gw.leases.claim(resource, ttl=30)
    assert lease is not None
    return gw, lease


for _fake in (FakeResend, FakePostmark, FakeSendGrid, FakeMailgun, FakeSes, FakeHubSpot):
    os.environ.setdefault(_fake.secret_env, _fake.secret)
os.environ.setdefault(FakeSes.key_id_env, FakeSes.key_id)
os.environ.setdefault("FENCEGATE_TEST_WRONG_SECRET", "not-the-key")


@pytest.fixture
async def admin(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection that watches (outside any transaction: inside one,
    pg_stat_activity would answer the same snapshot every time)."""
    conn = await asyncpg.connect(dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def locker(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """Another transaction, which holds lease rows locked."""
    conn = await asyncpg.connect(dsn)
    yield conn
    await conn.close()
