"""The headers the gateway stamps on an effect are its own: a caller can
neither set them on an email (400, nothing sent) nor add a second copy of
them to an HTTP request (the gateway's value replaces the caller's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.effects import fingerprint
from tests.integration.conftest import Gw, preset_provider
from tests.support.fake_providers import FakeProvider

MakeGw = Callable[..., Awaitable[Gw]]

FORGED = [
    {"Fence-Resource": "lead:victim"},
    {"Fence-Token": "9223372036854775807"},
    {"fence-resource": "lead:victim"},
    {"FENCE-TOKEN": "1"},
    {"message-id": "<forged@example.com>"},
]


@pytest.mark.parametrize("headers", FORGED)
async def test_an_email_may_not_set_the_fence_headers(gw: Gw, headers: dict[str, str]) -> None:
    """Fence-Resource and Fence-Token (any letter case) in an email's own
    headers are refused 400 before admission: nothing is sent or reserved."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-forge", body={"headers": headers})
    assert status == 400 and body["code"] == "bad_request", body
    assert gw.smtp.deliveries == []
    assert await gw.effect_state("k-forge") is None


async def test_an_email_may_not_set_the_smtp_providers_idempotency_header(
        make_gw: MakeGw) -> None:
    """The header an SMTP provider carries the derived key in is the gateway's."""
    gw = await make_gw(providers={"mail": {"idempotency_header": "X-Dedupe-Key"}})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-idem",
                                     body={"headers": {"x-dedupe-key": "forged"}})
    assert status == 400 and body["code"] == "bad_request", body
    assert gw.smtp.deliveries == []


async def test_an_email_api_carries_only_the_gateways_fence_headers(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """Resend's JSON ``headers`` never carries a caller's fence header."""
    gw = await make_gw(providers={"resend": preset_provider("resend", fakes["resend"])})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-api", body={
        "provider": "resend", "headers": {"fence-resource": "lead:victim"}})
    assert status == 400 and body["code"] == "bad_request", body
    assert fakes["resend"].sent == []


def _values(headers: dict[str, Any], name: str) -> list[str]:
    return [v for k, v in headers.items() if k.lower() == name.lower()]


async def test_an_http_request_carries_one_copy_of_each_gateway_header(
        make_gw: MakeGw) -> None:
    """Whatever the letter case a caller uses, each header the gateway sets
    (its fence headers, the provider's idempotency header by its configured
    name, the signing headers) reaches the provider once, with the gateway's
    value."""
    gw = await make_gw(providers={"signed": {"idempotency_header": "X-Request-Token"}})
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    # (the fence headers a caller sends are the ones the gateway reads and checks)
    forged = {"x-request-token": "forged", "Webhook-Id": "forged",
              "WEBHOOK-SIGNATURE": "v1,forged", "webhook-timestamp": "1"}
    status, _, _ = await gw.request("POST", "/v1/http/signed/evt",
                                    {**gw.headers(lease, "h-1"), **forged}, json={"a": 1})
    assert status == 200
    [d] = gw.hook.deliveries
    derived = fingerprint.derived_key("agents", "h-1")
    assert _values(d.headers, "X-Request-Token") == [derived]
    assert _values(d.headers, "Fence-Resource") == ["lead:7"]
    assert _values(d.headers, "Fence-Token") == [str(lease.fence)]
    assert _values(d.headers, "webhook-id") == [derived]
    assert len(_values(d.headers, "webhook-signature")) == 1
    assert _values(d.headers, "webhook-signature") != ["v1,forged"]
    assert _values(d.headers, "webhook-timestamp") != ["1"]
