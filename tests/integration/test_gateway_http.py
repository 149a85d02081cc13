"""HTTP effects through the gateway to a real aiohttp peer."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable

import pytest
from yarl import URL

from gateway.effects import fingerprint
from tests.integration.conftest import PROVIDER_TIMEOUT, Gw


async def test_a_request_is_forwarded_with_fence_and_provider_key(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    h = {**gw.headers(lease, "crm-1"), "X-Trace": "abc", "Connection": "keep-alive, X-Hop",
         "X-Hop": "secret-hop"}
    status, headers, body = await gw.request(
        "POST", "/v1/http/crm/contacts/7/notes?source=agent", h, json={"note": "hi"})
    assert status == 200 and body == {"ok": True}
    assert headers["Idempotency-Key"] == "crm-1"
    [d] = gw.hook.deliveries
    assert d.method == "POST" and d.path == "/api/contacts/7/notes?source=agent"
    assert d.header("Fence-Resource") == "lead:7"
    assert d.header("Fence-Token") == str(lease.fence)
    assert d.header("Idempotency-Key") == fingerprint.derived_key("agents", "crm-1")
    assert d.header("X-Trace") == "abc"
    assert d.header("X-Hop") is None  # named in Connection: hop-by-hop
    assert d.header("Authorization") is None  # the gateway's key never leaves it
    assert json.loads(d.body) == {"note": "hi"}


async def test_the_provider_answer_is_stored_and_replayed(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    gw.hook.status, gw.hook.reply = 201, {"id": 99}
    s1, _h1, b1 = await gw.request("PUT", "/v1/http/crm/contacts/7", gw.headers(lease, "put-1"),
                                  json={"a": 1})
    gw.hook.status, gw.hook.reply = 200, {"id": "other"}
    s2, h2, b2 = await gw.request("PUT", "/v1/http/crm/contacts/7", gw.headers(lease, "put-1"),
                                  json={"a": 1})
    assert (s1, b1) == (201, {"id": 99}) == (s2, b2)
    assert h2["Idempotent-Replayed"] == "true" and h2["Content-Type"].startswith(
        "application/json")
    assert len(gw.hook.deliveries) == 1


async def test_a_final_provider_rejection_is_replayed_too(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    gw.hook.status, gw.hook.reply = 404, {"error": "no such contact"}
    s1, _, b1 = await gw.request("DELETE", "/v1/http/crm/contacts/8", gw.headers(lease, "d"))
    s2, h2, b2 = await gw.request("DELETE", "/v1/http/crm/contacts/8", gw.headers(lease, "d"))
    assert (s1, b1) == (404, {"error": "no such contact"}) == (s2, b2)
    assert h2["Idempotent-Replayed"] == "true"
    assert len(gw.hook.deliveries) == 1


async def test_a_provider_5xx_frees_the_key(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    gw.hook.status = 503
    status, _, body = await gw.request("POST", "/v1/http/crm/x", gw.headers(lease, "k5"),
                                       json={})
    assert (status, body["code"], body["provider_status"]) == (502, "provider_error", 503)
    gw.hook.status = 200
    status, headers, _ = await gw.request("POST", "/v1/http/crm/x", gw.headers(lease, "k5"),
                                          json={})
    assert status == 200 and "Idempotent-Replayed" not in headers
    assert len(gw.hook.deliveries) == 2  # the first was refused by the provider


@pytest.mark.parametrize("path", [
    "../admin", "a/../../admin", "%2e%2e/admin", "a/%2E%2E/b", "a/%252e%252e/b",
    "http://evil.example/x", "/etc/passwd", "a\\..\\b", "./a",
    # what some servers and proxies still climb out with: path parameters,
    # dots with trailing spaces, three dots, and their encodings
    "..;/admin", "a/..;/b", "a;x=1/b", "a%3Bx/b", "...", "a/.../b", "a/..%20/b", "a/.%2E%20/b",
    "a/%09/b",
    # encodings of dots the filter cannot vouch for: only plain paths reach the provider
    # (raw full-width dots in the request line aiohttp's parser refuses itself:
    # tests/unit/test_gateway_pure.py checks the filter refuses them too)
    "%c0%ae%c0%ae/admin", "a/%ef%bc%8e%ef%bc%8e/admin",
])
async def test_paths_cannot_escape_the_base_url(gw: Gw, path: str) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    # sent as is (encoded=True): no client-side normalisation helps the gateway
    async with gw.http.get(URL(f"{gw.url}/v1/http/crm/{path}", encoded=True),
                           headers=gw.headers(lease, "p")) as r:
        status, body = r.status, await r.json(content_type=None)
    # aiohttp's router may refuse some before routing (404); the gateway the rest
    assert status in (400, 404), (path, status, body)
    assert gw.hook.deliveries == []


async def test_an_unknown_provider_is_never_reached(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    status, _, body = await gw.request("GET", "/v1/http/nope/x", gw.headers(lease, "u"))
    assert status == 400 and body["code"] == "bad_request"
    status, _, body = await gw.request("GET", "/v1/http/mail/x", gw.headers(lease, "u"))
    assert status == 400  # an smtp provider is not an HTTP peer
    assert gw.hook.deliveries == []


async def test_a_timeout_with_a_deduping_provider_is_resent_safely(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """crm honours Idempotency-Key for a day: the caller's repeat of a key
    whose attempt timed out is sent again, with the same provider key. (With
    ``resend_attempts = 0``: the gateway's own resends are tests/integration/
    test_resend_window.py.)"""
    gw = await make_gw(providers={"crm": {"resend_attempts": 0}})
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    gw.hook.delay = PROVIDER_TIMEOUT + 0.3
    status, _, body = await gw.request("POST", "/v1/http/crm/charge", gw.headers(lease, "t1"),
                                       json={"amount": 5})
    assert (status, body["code"]) == (504, "provider_timeout")
    gw.hook.delay = 0
    status, _, _ = await gw.request("POST", "/v1/http/crm/charge", gw.headers(lease, "t1"),
                                    json={"amount": 5})
    assert status == 200
    keys = {d.header("Idempotency-Key") for d in gw.hook.deliveries}
    assert len(gw.hook.deliveries) == 2 and len(keys) == 1


async def test_a_timeout_without_provider_dedupe_is_never_resent(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    before = await gw.metric("fencegate_effects_total", provider="hook", outcome="unknown")
    gw.hook.delay = PROVIDER_TIMEOUT + 0.3
    status, _, _ = await gw.request("POST", "/v1/http/hook/evt", gw.headers(lease, "t2"),
                                    json={})
    assert status == 504
    gw.hook.delay = 0
    status, _, body = await gw.request("POST", "/v1/http/hook/evt", gw.headers(lease, "t2"),
                                       json={})
    assert (status, body["code"]) == (409, "effect_outcome_unknown")
    assert len(gw.hook.deliveries) == 1
    assert await gw.metric("fencegate_effects_total", provider="hook",
                           outcome="unknown") == before + 1


async def test_the_rate_limit_answers_429_and_frees_the_key(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    # one a minute: the requests after the first are refused on any machine
    gw = await make_gw(providers={"slowlane": {"rate_limit_per_second": 1 / 60}})
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    before = await gw.metric("fencegate_effects_total", provider="slowlane",
                             outcome="rate_limited")
    results = [await gw.request("POST", "/v1/http/slowlane/x", gw.headers(lease, f"r{i}"),
                                json={}) for i in range(4)]
    limited = [r for r in results if r[0] == 429]
    assert limited and all(r[2]["code"] == "rate_limited" and int(r[1]["Retry-After"]) >= 1
                           for r in limited)
    sent = len(gw.hook.deliveries)
    assert sent == 4 - len(limited)
    assert await gw.metric("fencegate_effects_total", provider="slowlane",
                           outcome="rate_limited") == before + len(limited)
    # as if the minute had passed: the bucket has a token again
    gw.gateway.buckets["slowlane"].updated -= 60  # type: ignore[operator]
    key = next(f"r{i}" for i, r in enumerate(results) if r[0] == 429)
    status, _, _ = await gw.request("POST", "/v1/http/slowlane/x", gw.headers(lease, key),
                                    json={})
    assert status == 200


async def test_oversize_request_bodies_are_refused(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    status, _, body = await gw.request("POST", "/v1/http/crm/x", gw.headers(lease, "big"),
                                       data=b"x" * (64 * 1024 + 1))
    assert (status, body["code"]) == (413, "payload_too_large")
    assert gw.hook.deliveries == []


def test_webhook_signatures_follow_standard_webhooks() -> None:
    from gateway.signing import webhook_signature

    secret = "whsec_" + base64.b64encode(b"0123456789abcdef").decode()
    sig = webhook_signature(secret, "msg_1", 1700000000, b'{"a":1}')
    expected = base64.b64encode(hmac.new(b"0123456789abcdef", b'msg_1.1700000000.{"a":1}',
                                         hashlib.sha256).digest()).decode()
    assert sig == "v1," + expected


async def test_signed_providers_get_standard_webhooks_headers_and_their_own_credentials(
    gw: Gw,
) -> None:
    from gateway.signing import webhook_signature
    from tests.integration.conftest import SIGNING_SECRET

    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    status, _, _ = await gw.request("POST", "/v1/http/signed/evt", gw.headers(lease, "sig-1"),
                                    json={"a": 1})
    assert status == 200
    [d] = gw.hook.deliveries
    msg_id, ts = d.header("webhook-id"), d.header("webhook-timestamp")
    assert msg_id == fingerprint.derived_key("agents", "sig-1")
    assert ts is not None and abs(int(ts) - __import__("time").time()) < 60
    assert d.header("webhook-signature") == webhook_signature(SIGNING_SECRET, msg_id, int(ts),
                                                              d.body)
    assert d.header("Authorization") == "Bearer crm-secret-token"


async def test_signed_providers_get_their_fence_headers_signed(gw: Gw) -> None:
    """The Standard Webhooks signature covers the id, the timestamp and the
    body, not the Fence-Resource/Fence-Token headers: with it alone, anyone
    holding one signed request could send it again with another fence (a
    huge one, and the receiver refuses every real fence after it).
    ``Fence-Signature`` covers both fence headers, the id, the timestamp and
    the body, under the same key."""
    from tests.integration.conftest import SIGNING_SECRET

    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    status, _, _ = await gw.request("POST", "/v1/http/signed/evt",
                                    {**gw.headers(lease, "sig-2"), "Fence-Signature": "v1,x"},
                                    json={"a": 1})
    assert status == 200
    [d] = gw.hook.deliveries
    key = base64.b64decode(SIGNING_SECRET.removeprefix("whsec_"))
    content = (f"fencegate-fence\n{d.header('webhook-id')}\n{d.header('webhook-timestamp')}\n"
               f"lead:7\n{lease.fence}\n").encode() + d.body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    assert d.header("Fence-Signature") == "v1," + expected  # the caller's copy replaced


async def test_unsigned_providers_never_forward_a_callers_fence_signature(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    status, _, _ = await gw.request("POST", "/v1/http/hook/evt",
                                    {**gw.headers(lease, "sig-3"), "fence-signature": "v1,x"},
                                    json={})
    assert status == 200
    [d] = gw.hook.deliveries
    assert d.header("Fence-Signature") is None


async def test_redirects_come_back_and_are_never_followed(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    gw.hook.status = 302
    gw.hook.reply_headers = {"Location": "http://evil.example/steal"}
    async with gw.http.post(f"{gw.url}/v1/http/crm/x", headers=gw.headers(lease, "r-1"),
                            json={}, allow_redirects=False) as r:
        assert r.status == 302 and r.headers["Location"] == "http://evil.example/steal"
    assert len(gw.hook.deliveries) == 1


async def test_an_oversize_provider_answer_is_cut_and_flagged(gw: Gw) -> None:
    lease = await gw.leases.claim("lead:7", ttl=30)
    assert lease is not None
    gw.hook.reply = {"blob": "x" * 100_000}
    status, headers, body = await gw.request("GET", "/v1/http/crm/big",
                                             gw.headers(lease, "big-1"))
    assert status == 200 and headers["Fencegate-Truncated"] == "true"
    assert len(body) == 64 * 1024
