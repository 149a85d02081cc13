"""Safe resends inside the provider's idempotency window (issue 14).

A provider that dedupes on our key acts on the first request, and its answer
is lost (the connection dropped, or no answer in time): the gateway extends
the attempt in the ledger, sends it again with the same key, and answers the
caller with the provider's answer. Everything that should stop a resend does:
a window too short, a provider that dedupes nothing, SMTP, a lease lost or a
newer fence granted between the attempts. Real gateway, real PostgreSQL, the
fakes of tests/support/fake_providers on loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import pytest
from aiohttp import web

from gateway.effects import fingerprint
from gateway.providers import ProviderCall
from leases import Lease
from tests.integration.conftest import Gw, preset_provider
from tests.support.fake_providers import FakeProvider

MakeGw = Callable[..., Awaitable[Gw]]
RESENDS = "fencegate_provider_resends_total"


async def _gateway(make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str,
                   *, server: dict[str, Any] | None = None, **over: Any) -> Gw:
    return await make_gw(providers={name: preset_provider(name, fakes[name], **over)},
                         **(server or {}))


async def _effect(gw: Gw, key: str) -> dict[str, Any]:
    status, _, body = await gw.request("GET", f"/v1/effects/{key}", gw.headers(key=key))
    assert status == 200, body
    effect: dict[str, Any] = body
    return effect


async def _inflight(gw: Gw, resource: str) -> int:
    n: int = await gw.pool.fetchval(
        "SELECT inflight FROM fencegate_leases WHERE resource = $1", resource)
    return n


@pytest.mark.parametrize("lost", ["close", "stall"])
async def test_an_answer_lost_after_the_provider_acted_is_resent_and_answered(
        make_gw: MakeGw, fakes: dict[str, FakeProvider],
        lost: Literal["close", "stall"]) -> None:
    """Resend dedupes on Idempotency-Key for a day. Its answer to the first
    request is lost; the resend carries the same key, Resend answers the first
    email's id, and the caller gets it: one email, a definite answer."""
    gw = await _gateway(make_gw, fakes, "resend")
    fake = fakes["resend"]
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    keys: list[str | None] = []
    reclaimed: list[Lease | None] = []

    async def arrived(request: web.Request) -> None:
        keys.append(request.headers.get("Idempotency-Key"))
        # the attempt holds the drain barrier: not even its own holder gets a
        # newer fence while it may still land (the resend's included)
        reclaimed.append(await gw.leases.claim("run:1", ttl=30))

    fake.on_request = arrived
    fake.lose_answers = [lost]
    before = await gw.metric(RESENDS, provider="resend", outcome="answered")
    status, headers, body = await gw.email(lease, "lost-1", body={"provider": "resend"})

    assert status == 200, body
    assert "Fencegate-Problem" not in headers
    assert len(fake.sent) == 1
    assert body["status"] == "sent" and body["provider_message_id"] == fake.sent[0].id
    assert body["provider_response"]["status"] == 200
    assert keys == [fingerprint.derived_key("agents", "lost-1")] * 2
    assert reclaimed == [None, None]
    assert await gw.metric(RESENDS, provider="resend", outcome="answered") == before + 1

    effect = await _effect(gw, "lost-1")
    assert (effect["state"], effect["attempts"]) == ("succeeded", 2)
    assert effect["provider_response"]["status"] == 200
    assert await _inflight(gw, "run:1") == 0  # one attempt, counted once, ended once

    again, headers, replayed = await gw.email(lease, "lost-1", body={"provider": "resend"})
    assert again == 200 and headers["Idempotent-Replayed"] == "true" and replayed == body
    assert len(fake.requests) == 2 and len(fake.sent) == 1


async def test_a_crm_write_whose_answer_was_lost_is_resent_with_the_same_key(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """``/v1/http`` too: Resend's own API, the answer dropped after it acted."""
    gw = await _gateway(make_gw, fakes, "resend")
    fake = fakes["resend"]
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    fake.lose_answers = ["close"]
    email = {"from": "a@example.com", "to": ["b@example.com"], "subject": "S", "text": "T"}
    status, _, body = await gw.post("/v1/http/resend/emails", gw.headers(lease, "raw-lost"),
                                    json=email)
    assert status == 200 and body == {"id": fake.sent[0].id}, body
    assert len(fake.sent) == 1 and len(fake.requests) == 2


async def test_no_resend_when_the_window_cannot_cover_it(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """A window of 5 s is all margin: no resend can end inside it. The
    outcome stays unknown, as before, and nothing is sent twice."""
    gw = await _gateway(make_gw, fakes, "resend", idempotency_window_seconds=5)
    fake = fakes["resend"]
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    fake.lose_answers = ["close"]
    before = await gw.metric(RESENDS, provider="resend", outcome="outside_window")
    status, _, body = await gw.email(lease, "short", body={"provider": "resend"})
    assert (status, body["code"]) == (504, "provider_timeout"), body
    assert len(fake.requests) == 1 and len(fake.sent) == 1
    assert await gw.metric(RESENDS, provider="resend", outcome="outside_window") == before + 1
    status, _, body = await gw.email(lease, "short", body={"provider": "resend"})
    assert (status, body["code"]) == (409, "effect_outcome_unknown")
    assert len(fake.requests) == 1


@pytest.mark.parametrize("name", ["postmark", "mailgun"])
async def test_a_provider_that_dedupes_nothing_is_never_resent(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str) -> None:
    gw = await _gateway(make_gw, fakes, name)
    fake = fakes[name]
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    fake.lose_answers = ["close"]
    status, _, body = await gw.email(lease, "once", body={"provider": name})
    assert (status, body["code"]) == (504, "provider_timeout"), body
    assert len(fake.requests) == 1 and len(fake.sent) == 1
    effect = await _effect(gw, "once")
    assert (effect["state"], effect["attempts"]) == ("unknown", 1)


async def test_smtp_never_resends_even_to_a_relay_that_dedupes(make_gw: MakeGw) -> None:
    """An SMTP relay that dedupes on a header inside the message (Resend's
    SMTP): a DATA answered too late stays unknown within the request."""
    header = "Resend-Idempotency-Key"
    gw = await make_gw(providers={"mail": {"idempotency_header": header,
                                           "idempotency_window_seconds": 86400}})
    gw.smtp.dedupe_header, gw.smtp.dedupe_window = header, 86400.0
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    gw.smtp.next_data_delays = [1.5]  # past the gateway's 1 s timeout
    status, _, body = await gw.email(lease, "smtp-once")
    assert (status, body["code"]) == (504, "provider_timeout"), body
    assert len(gw.smtp.deliveries) == 1  # recorded as DATA arrived: no second one


async def test_a_lease_released_between_the_attempts_stops_the_resend(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw = await _gateway(make_gw, fakes, "resend")
    fake = fakes["resend"]
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None

    async def release(call: ProviderCall) -> None:
        assert await lease.release()

    gw.gateway.before_resend = release
    fake.lose_answers = ["close"]
    before = await gw.metric(RESENDS, provider="resend", outcome="lease_expired")
    status, _, body = await gw.email(lease, "released", body={"provider": "resend"})
    assert (status, body["code"]) == (504, "provider_timeout"), body
    assert len(fake.requests) == 1
    assert await gw.metric(RESENDS, provider="resend", outcome="lease_expired") == before + 1
    effect = await _effect(gw, "released")
    assert (effect["state"], effect["attempts"]) == ("unknown", 1)


async def test_a_newer_fence_granted_while_the_resend_waits_stops_it(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """The drain barrier: the first attempt holds it until its deadline. If
    the resend waits past that (here: a test hook claims until it wins), a
    newer fence is granted, and the fence F resend must never go out."""
    gw = await _gateway(make_gw, fakes, "resend",
                        server={"database_timeout_seconds": 0.5,
                                "barrier_grace_seconds": 0.5})
    fake = fakes["resend"]
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    newer: list[Lease] = []

    async def claim_until_won(call: ProviderCall) -> None:
        while True:  # same owner, live lease: only the barrier holds the claim back
            won = await gw.leases.claim("run:1", ttl=30)
            if won is not None:
                newer.append(won)
                return
            await asyncio.sleep(0.02)

    gw.gateway.before_resend = claim_until_won
    fake.lose_answers = ["close"]
    before = await gw.metric(RESENDS, provider="resend", outcome="stale_fence")
    status, _, body = await gw.email(lease, "superseded", body={"provider": "resend"})
    assert (status, body["code"]) == (504, "provider_timeout"), body
    assert newer and newer[0].fence > lease.fence
    assert len(fake.requests) == 1
    assert await gw.metric(RESENDS, provider="resend", outcome="stale_fence") == before + 1
    effect = await _effect(gw, "superseded")
    assert (effect["state"], effect["attempts"]) == ("unknown", 1)
