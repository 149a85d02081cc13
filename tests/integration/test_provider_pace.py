"""A provider's 429 paces every caller, not only the one request (issue 14).

Resend's fake answers 429 with ``Retry-After`` once. Until the pause is
over, effects to Resend are refused before admission (nothing reserved, the
key stays free, nothing reaches the fake); a pause of a second or less is
waited out instead; another provider is not slowed. Real gateway, real
PostgreSQL, the fakes on loopback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from tests.integration.conftest import OTHER_KEY, Gw, preset_provider
from tests.support.fake_providers import FakeProvider

MakeGw = Callable[..., Awaitable[Gw]]
TOO_MANY = {"statusCode": 429, "name": "rate_limit_exceeded",
            "message": "Too many requests. You can only make 2 requests per second."}
#: long enough that the second caller certainly comes within it, past the
#: pause a request waits out (gateway/effects/pace.py, PACE_WAIT_SECONDS)
PAUSE = 3


async def _gateway(make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> Gw:
    return await make_gw(providers={
        "resend": preset_provider("resend", fakes["resend"]),
        "postmark": preset_provider("postmark", fakes["postmark"])})


async def _refused(gw: Gw, provider: str) -> float:
    return await gw.metric("fencegate_rate_limited_total", provider=provider,
                           reason="provider_paused")


async def test_a_429_pauses_the_provider_for_every_caller(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw = await _gateway(make_gw, fakes)
    resend, postmark = fakes["resend"], fakes["postmark"]
    first = await gw.leases.claim("run:1", ttl=60)
    second = await gw.leases.claim("run:2", ttl=60)
    assert first is not None and second is not None

    refused = await _refused(gw, "resend")
    paused = await gw.metric("fencegate_provider_paused_seconds_total", provider="resend")
    resend.fail_next(429, TOO_MANY, headers={"Retry-After": str(PAUSE)})
    status, headers, body = await gw.email(first, "a", body={"provider": "resend"})
    assert (status, body["code"], body["provider_status"]) == (502, "provider_error", 429)
    assert headers["Retry-After"] == str(PAUSE)
    assert len(resend.requests) == 1 and not resend.sent

    # another caller, another key, another resource: refused before admission
    status, headers, body = await gw.email(second, "b", body={"provider": "resend"})
    assert (status, body["code"], body["reason"]) == (429, "rate_limited", "provider_paused")
    assert 1 <= int(headers["Retry-After"]) <= PAUSE
    assert len(resend.requests) == 1
    assert await gw.pool.fetchval("SELECT count(*) FROM fencegate_effects "
                                  "WHERE idempotency_key = 'b'") == 0
    assert await _refused(gw, "resend") == refused + 1
    assert await gw.metric("fencegate_provider_paused_seconds_total",
                           provider="resend") == pytest.approx(paused + PAUSE)

    # another provider is not slowed
    others = await _refused(gw, "postmark")
    status, _, body = await gw.email(second, "c", body={"provider": "postmark"})
    assert status == 200 and len(postmark.sent) == 1, body
    assert await _refused(gw, "postmark") == others

    # once the pause is over, the refused key goes through
    await asyncio.sleep(int(headers["Retry-After"]))
    status, _, body = await gw.email(second, "b", body={"provider": "resend"})
    assert status == 200 and len(resend.sent) == 1, body
    assert resend.sent[0].id == body["provider_message_id"]


async def test_a_pause_of_a_second_is_waited_out_not_refused(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw = await _gateway(make_gw, fakes)
    resend = fakes["resend"]
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    refused = await _refused(gw, "resend")
    resend.fail_next(429, TOO_MANY, headers={"Retry-After": "1"})
    status, _, body = await gw.email(lease, "a", body={"provider": "resend"})
    assert (status, body["code"]) == (502, "provider_error")
    status, _, body = await gw.email(lease, "b", body={"provider": "resend"})
    assert status == 200, body
    assert len(resend.requests) == 2 and len(resend.sent) == 1
    assert await _refused(gw, "resend") == refused


async def test_a_huge_retry_after_pauses_the_provider_for_a_bounded_time(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """One client's 429 with ``Retry-After: 86400`` (a quota's "tomorrow", or
    a provider's answer to one client's bad request) pauses the provider for
    every other client of this process for at most 30 seconds
    (gateway/effects/pace.py, MAX_PAUSE_SECONDS), not for the day and not for ten
    minutes: past it, one request finds out whether the provider takes
    requests again. The caller that met the 429 is told the same bound."""
    gw = await _gateway(make_gw, fakes)
    resend = fakes["resend"]
    first = await gw.leases.claim("run:1", ttl=60)
    other = await gw.leases.claim("other:1", ttl=60)
    assert first is not None and other is not None
    paused = await gw.metric("fencegate_provider_paused_seconds_total", provider="resend")
    resend.fail_next(429, TOO_MANY, headers={"Retry-After": "86400"})
    status, headers, body = await gw.email(first, "a", body={"provider": "resend"})
    assert (status, body["code"], headers["Retry-After"]) == (502, "provider_error", "30")

    status, headers, body = await gw.email(other, "b", body={"provider": "resend"},
                                           api_key=OTHER_KEY)
    assert (status, body["code"], body["reason"]) == (429, "rate_limited", "provider_paused")
    assert 1 <= int(headers["Retry-After"]) <= 30
    assert gw.gateway.pauses.remaining("resend", time.monotonic()) <= 30
    assert await gw.metric("fencegate_provider_paused_seconds_total",
                           provider="resend") == pytest.approx(paused + 30)


@pytest.mark.parametrize("retry_after", ["\u00b2", "\u2460", "\u0661\u0662\u0663\u0664\u0665"])
async def test_a_retry_after_of_unicode_digits_is_a_429_like_any_other(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], retry_after: str) -> None:
    """``Retry-After`` is ASCII delay-seconds (RFC 9110) or an HTTP date. A
    value of other Unicode digits ("²" is a digit to str.isdigit, not to
    float) is unreadable, as any other: the 429 pauses the provider for the
    default second; it is never a 500 with the key left in flight."""
    gw = await _gateway(make_gw, fakes)
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    fakes["resend"].fail_next(429, TOO_MANY, headers={"Retry-After": retry_after})
    status, headers, body = await gw.email(lease, "k-digits", body={"provider": "resend"})
    assert (status, body["code"], body.get("provider_status")) == \
        (502, "provider_error", 429), body
    assert headers["Retry-After"] == "1"
    assert await gw.effect_state("k-digits") is None  # the key is free again


@pytest.mark.parametrize("retry_after", ["Mon, 01 Jan 99999999999999999999 00:00:00 GMT",
                                         "01 Jan 2020 00:00:00 +99999999999999999999"])
async def test_a_retry_after_date_out_of_range_is_a_429_like_any_other(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], retry_after: str) -> None:
    """An HTTP date whose year or zone is past what a datetime holds makes
    email.utils raise OverflowError, which is not a ValueError: the 429 read
    it after the admission and answered 500, the key left in flight. It is
    an unreadable Retry-After: the default pause, the key free again."""
    gw = await _gateway(make_gw, fakes)
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    fakes["resend"].fail_next(429, TOO_MANY, headers={"Retry-After": retry_after})
    status, headers, body = await gw.email(lease, "k-date", body={"provider": "resend"})
    assert (status, body["code"], body.get("provider_status")) == \
        (502, "provider_error", 429), body
    assert headers["Retry-After"] == "1"
    assert await gw.effect_state("k-date") is None
