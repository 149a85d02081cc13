"""A database outage longer than ``RECORD_RETRY_SECONDS`` while an outcome
waits to be recorded (gateway/outcomes.py, ``OutcomeWriter``).

The caller had its 200; the record of it never lands. It must not be lost
silently: the gateway logs it and counts it
(``fencegate_effect_records_given_up_total``), and the effect stays in the
state its admission committed, in flight, which reads in progress until its
deadline and unknown after it: a repeat of the key is never sent again.
(The retry window is shortened in-process; the outage is real: a proxy
between the gateway and PostgreSQL drops every connection and refuses new
ones.)"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from prometheus_client import REGISTRY

from gateway import outcomes
from tests.integration.conftest import Gw
from tests.support.faultproxy import FaultProxy

GIVEN_UP = "fencegate_effect_records_given_up_total"


@pytest.fixture
async def proxy(dsn: str) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy(dsn).start()
    yield p
    await p.close()


def _given_up() -> float:
    return REGISTRY.get_sample_value(GIVEN_UP, {"state": "succeeded"}) or 0.0


async def test_an_outcome_given_up_in_an_outage_reads_unknown_and_is_not_sent_again(
    make_gw: Callable[..., Awaitable[Gw]], proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(outcomes, "RECORD_RETRY_SECONDS", 2.0)
    monkeypatch.setattr(outcomes, "RECORD_RETRY_PAUSE_SECONDS", 0.2)
    gw = await make_gw(proxy.dsn(), database_timeout_seconds=1.0)
    lease = await gw.leases.claim("run:outage", ttl=120)
    assert lease is not None
    # the outage starts as the provider takes the request: the answer comes
    # back, its record cannot be written
    gw.hook.on_request = lambda _: proxy.set_mode("drop")
    before = _given_up()
    status, _, _ = await gw.post("/v1/http/hook/x", gw.headers(lease, "lost"), json={"n": 1})
    assert status == 200 and len(gw.hook.deliveries) == 1
    gw.hook.on_request = None

    give_up = time.monotonic() + 60
    while _given_up() == before:  # tried for RECORD_RETRY_SECONDS, then given up
        assert time.monotonic() < give_up, "the record was neither landed nor given up"
        await asyncio.sleep(0.05)
    assert _given_up() == before + 1
    assert any(r.levelno == logging.ERROR and "could not record an effect's outcome"
               in r.getMessage() and getattr(r, "key", None) == "lost"
               for r in caplog.records), caplog.records
    proxy.set_mode("pass")  # the database is back; the record is not

    assert await gw.effect_state("lost") == "in_flight"  # what the admission committed
    again, _, body = await gw.post("/v1/http/hook/x", gw.headers(lease, "lost"),
                                   json={"n": 1})
    assert again == 409 and body["code"] in ("effect_in_progress", "effect_outcome_unknown")
    give_up = time.monotonic() + 60
    while True:  # past its deadline it reads unknown, to operators and callers
        status, _, shown = await gw.request("GET", "/v1/effects/lost", gw.headers())
        assert status == 200 and shown["state"] in ("in_flight", "unknown"), shown
        if shown["state"] == "unknown":
            break
        assert time.monotonic() < give_up, shown
        await asyncio.sleep(0.1)
    again, _, body = await gw.post("/v1/http/hook/x", gw.headers(lease, "lost"),
                                   json={"n": 1})
    assert (again, body["code"]) == (409, "effect_outcome_unknown"), body
    assert len(gw.hook.deliveries) == 1  # never sent again
