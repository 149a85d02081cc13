"""Hostile input, generated: schemathesis walks every operation of
/openapi.json with valid and invalid requests. Whatever it sends, the gateway
answers without a 5xx, every error is a problem document with a contract
code, and nothing reaches a provider."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings

from gateway.api.openapi import document
from gateway.api.problems import PROBLEMS
from gateway.api.routes import ROUTES
from gateway.app import build_app
from gateway.dev.sinks import SmtpSink, WebhookSink
from leases import database
from tests.conftest import TEMPLATE
from tests.integration.conftest import API_KEY, gateway_config

schema = schemathesis.openapi.from_dict(document(ROUTES))
DB = f"fg_test_{os.getpid()}_fuzz"


@dataclass
class Live:
    url: str
    smtp: SmtpSink
    hook: WebhookSink


@pytest.fixture(scope="module")
def live(template_ready: str) -> Iterator[Live]:
    async def make_db() -> None:
        admin = await asyncpg.connect(template_ready)
        await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{DB}" TEMPLATE {TEMPLATE}')
        await admin.close()

    asyncio.run(make_db())
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        smtp, hook = await SmtpSink().start(), await WebhookSink().start()
        app = build_app(gateway_config(smtp.port, hook.port),
                        database.with_database(template_ready, DB), migrate_on_start=False)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        holder.update(live=Live(f"http://127.0.0.1:{runner.addresses[0][1]}", smtp, hook),
                      runner=runner, stop=asyncio.Event())
        ready.set()
        await holder["stop"].wait()
        await runner.cleanup()
        await smtp.close()
        await hook.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield holder["live"]
    loop.call_soon_threadsafe(holder["stop"].set)
    thread.join(30)
    loop.close()


@schema.parametrize()
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_no_generated_request_gets_a_5xx_or_reaches_a_provider(case: Any, live: Live) -> None:
    # a valid key, so the fuzzing reaches past authentication (tested by hand elsewhere)
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {API_KEY}"}
    response = case.call(base_url=live.url)
    assert response.status_code < 500, (case.method, case.path, response.text)
    # every answer is one /openapi.json lists for the route, in the shape it says
    case.validate_response(response, checks=[
        schemathesis.checks.status_code_conformance,
        schemathesis.checks.content_type_conformance,
        schemathesis.checks.response_schema_conformance])
    if response.status_code >= 400:
        body = response.json()
        assert body["code"] in PROBLEMS and body["status"] == response.status_code
        content_type = response.headers.get("content-type", [""])[0]
        assert content_type.startswith("application/problem+json"), (case.method, case.path)
    assert live.smtp.deliveries == [] and live.hook.deliveries == []
