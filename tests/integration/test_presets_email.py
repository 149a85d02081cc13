"""``POST /v1/email`` through each HTTP email preset, against a fake of its
provider written from the provider's documentation (tests/support/fake_providers):
the same fields, fencing, idempotency and replay as over SMTP, the same answer
shape, and the provider's message id surfaced."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from email.utils import parseaddr
from typing import Any

import pytest

from gateway.effects import fingerprint
from tests.integration.conftest import Gw, gateway_with, preset_gateway
from tests.support.fake_providers import FakeProvider

EMAIL_PRESETS = ["resend", "postmark", "sendgrid", "mailgun", "ses"]
#: the status each provider documents for a message it refuses for good
REJECTION = {"resend": (422, {"statusCode": 422, "name": "validation_error",
                              "message": "Invalid `to` field."}),
             "postmark": (422, {"ErrorCode": 300, "Message": "Invalid email request"}),
             "sendgrid": (400, {"errors": [{"message": "Invalid email", "field": "to"}]}),
             "mailgun": (400, {"message": "to parameter is not a valid address"})}
PDF = b"%PDF-1.4 fencegate test attachment\x00\x01\x02"
ANSWER_KEYS = {"status", "message_id", "provider", "provider_message_id", "provider_response"}

MakeGw = Callable[..., Awaitable[Gw]]


def full_email(provider: str) -> dict[str, Any]:
    return {"provider": provider, "from": "Agent <agent@example.com>",
            "to": ["Lead <lead@example.com>", "second@example.com"],
            "cc": ["cc@example.com"], "bcc": ["audit@example.com"],
            "reply_to": "replies@example.com", "subject": "Your quote",
            "text": "Plain body", "html": "<p>HTML body</p>",
            "headers": {"X-Campaign": "spring"},
            "attachments": [{"filename": "quote.pdf", "content": base64.b64encode(PDF).decode(),
                             "content_type": "application/pdf"}]}


def bare(addresses: list[str]) -> list[str]:
    return [parseaddr(a)[1] for a in addresses]


@pytest.mark.parametrize("name", EMAIL_PRESETS)
async def test_an_email_is_mapped_whole_and_sent_once(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str) -> None:
    gw, lease = await gateway_with(make_gw, fakes, name)
    fake = fakes[name]
    status, headers, body = await gw.post("/v1/email", gw.headers(lease, "quote-1"),
                                          json=full_email(name))
    assert status == 200, body
    assert set(body) == ANSWER_KEYS and body["status"] == "sent" and body["provider"] == name
    assert headers["Idempotency-Key"] == "quote-1"
    assert len(fake.sent) == 1
    sent = fake.sent[0]
    assert body["provider_message_id"] == sent.id
    assert body["message_id"] == fingerprint.message_id("agents", "quote-1")
    assert body["provider_response"]["status"] in (200, 202)
    # every field of the gateway's JSON reached the provider, where its API puts it
    assert parseaddr(sent.sender)[1] == "agent@example.com"
    assert bare(sent.to) == ["lead@example.com", "second@example.com"]
    assert bare(sent.cc) == ["cc@example.com"] and bare(sent.bcc) == ["audit@example.com"]
    assert sent.reply_to == "replies@example.com" and sent.subject == "Your quote"
    assert (sent.text or "").strip() == "Plain body"
    assert (sent.html or "").strip() == "<p>HTML body</p>"
    assert sent.attachments == [("quote.pdf", "application/pdf", PDF)]
    # the email names its effect and its fence, as over SMTP
    assert sent.header("Message-ID") == body["message_id"]
    assert sent.header("Fence-Token") == str(lease.fence)
    assert sent.header("Fence-Resource") == "run:1"
    assert sent.header("X-Campaign") == "spring"
    # ... and so does the HTTP request that carried it
    assert sent.request_header("Fence-Token") == str(lease.fence)
    assert sent.request_header("Fence-Resource") == "run:1"
    derived = fingerprint.derived_key("agents", "quote-1")
    if name == "resend":  # the only one of these that documents an idempotency key
        assert sent.request_header("Idempotency-Key") == derived
    else:
        assert sent.request_header("Idempotency-Key") is None


@pytest.mark.parametrize("name", EMAIL_PRESETS)
async def test_a_repeat_is_replayed_and_nothing_is_sent_again(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str) -> None:
    gw, lease = await gateway_with(make_gw, fakes, name)
    first = await gw.email(lease, "welcome-1", body={"provider": name})
    second = await gw.email(lease, "welcome-1", body={"provider": name})
    assert first[0] == second[0] == 200
    assert second[1]["Idempotent-Replayed"] == "true" and second[2] == first[2]
    assert len(fakes[name].sent) == 1


async def test_an_emails_key_repeated_on_the_providers_http_route_is_another_request(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """/v1/email and /v1/http/resend/email with the same body have different
    fingerprints: the key's repeat on the other route is another request,
    answered 422, nothing sent."""
    gw, lease = await gateway_with(make_gw, fakes, "resend")
    body = {"provider": "resend", "from": "Agent <agent@example.com>",
            "to": ["lead@example.com"], "subject": "Hello", "text": "Hi there"}
    status, _, _ = await gw.post("/v1/email", gw.headers(lease, "one-key"), json=body)
    assert status == 200
    status, _, answer = await gw.post("/v1/http/resend/email", gw.headers(lease, "one-key"),
                                      json=body)
    assert (status, answer["code"]) == (422, "idempotency_key_reused")
    assert len(fakes["resend"].sent) == 1


@pytest.mark.parametrize("name", EMAIL_PRESETS)
async def test_the_answer_has_the_same_shape_as_over_smtp(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str) -> None:
    gw, lease = await gateway_with(make_gw, fakes, name)
    over_smtp = await gw.email(lease, "smtp-1", body={"provider": "mail"})
    over_api = await gw.email(lease, "api-1", body={"provider": name})
    assert over_smtp[0] == over_api[0] == 200
    assert set(over_smtp[2]) == set(over_api[2]) == ANSWER_KEYS
    assert over_smtp[1]["Content-Type"] == over_api[1]["Content-Type"] == "application/json"


@pytest.mark.parametrize("name", EMAIL_PRESETS)
async def test_a_rate_limited_answer_frees_the_key(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str) -> None:
    gw, lease = await gateway_with(make_gw, fakes, name)
    fake = fakes[name]
    fake.fail_next(429, {"message": "Too many requests"}, headers={"Retry-After": "1"})
    status, _, body = await gw.email(lease, "k-429", body={"provider": name})
    assert status == 502 and body["code"] == "provider_error", body
    assert body["provider_status"] == 429 and not fake.sent
    status, _, body = await gw.email(lease, "k-429", body={"provider": name})
    assert status == 200 and len(fake.sent) == 1


@pytest.mark.parametrize("name", ["postmark", "sendgrid", "mailgun", "ses"])
async def test_an_answer_that_may_follow_the_send_leaves_it_unknown(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str) -> None:
    """Providers that dedupe nothing: never sent again."""
    gw, lease = await gateway_with(make_gw, fakes, name)
    fake = fakes[name]
    fake.fail_next(500, {"message": "Internal error"}, acted=True)
    status, _, body = await gw.email(lease, "k-500", body={"provider": name})
    assert status == 502 and body["code"] == "provider_outcome_unknown", body
    status, _, body = await gw.email(lease, "k-500", body={"provider": name})
    assert status == 409 and body["code"] == "effect_outcome_unknown"
    assert len(fake.sent) == 1


async def test_resend_dedupes_the_resend_of_an_unknown_effect(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """Resend remembers our key for 24 hours: after a 500 that came once it
    had sent the email, the gateway sends it again with the same key within
    the request, Resend answers the first email's id, and one email exists."""
    gw, lease = await gateway_with(make_gw, fakes, "resend")
    fake = fakes["resend"]
    fake.fail_next(500, {"statusCode": 500, "name": "application_error",
                         "message": "An unexpected error occurred."}, acted=True)
    status, _, body = await gw.email(lease, "k-resend", body={"provider": "resend"})
    assert status == 200, body
    assert len(fake.sent) == 1 and body["provider_message_id"] == fake.sent[0].id
    assert fake.requests.count(("POST", "/emails")) == 2


async def test_a_repeat_of_an_unknown_effect_is_resent_inside_the_window(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """With ``resend_attempts = 0`` the gateway answers the 500 unknown; the
    caller's repeat of the key, inside the window, is sent again with the same
    key, and Resend answers the first email's id."""
    gw, lease = await gateway_with(make_gw, fakes, "resend", resend_attempts=0)
    fake = fakes["resend"]
    fake.fail_next(500, {"statusCode": 500, "name": "application_error",
                         "message": "An unexpected error occurred."}, acted=True)
    status, _, body = await gw.email(lease, "k-resend", body={"provider": "resend"})
    assert status == 502 and body["code"] == "provider_outcome_unknown"
    status, _, body = await gw.email(lease, "k-resend", body={"provider": "resend"})
    assert status == 200, body
    assert len(fake.sent) == 1 and body["provider_message_id"] == fake.sent[0].id
    assert fake.requests.count(("POST", "/emails")) == 2


@pytest.mark.parametrize("name", sorted(REJECTION))
async def test_a_final_refusal_is_stored_and_replayed(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str) -> None:
    gw, lease = await gateway_with(make_gw, fakes, name)
    fake = fakes[name]
    code, answer = REJECTION[name]
    fake.fail_next(code, answer)
    status, _, body = await gw.email(lease, "k-refused", body={"provider": name})
    assert status == 422 and body["code"] == "provider_rejected", body
    assert body["provider_status"] == code and body["provider_answer"] == answer
    status, headers, again = await gw.email(lease, "k-refused", body={"provider": name})
    assert status == 422 and headers["Idempotent-Replayed"] == "true" and again == body
    assert not fake.sent and len(fake.requests) == 1


@pytest.mark.parametrize("name", EMAIL_PRESETS)
async def test_a_refused_credential_sends_nothing_and_frees_the_key(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], name: str) -> None:
    """As an SMTP AUTH refusal: fix the secret, and the same key goes out."""
    wrong = {"aws_secret_access_key_env" if name == "ses" else "api_key_env":
             "FENCEGATE_TEST_WRONG_SECRET"}
    gw, lease = await gateway_with(make_gw, fakes, name, **wrong)
    status, _, body = await gw.email(lease, "k-auth", body={"provider": name})
    assert status == 502 and body["code"] == "provider_error", body
    assert body["provider_status"] in (401, 403) and not fakes[name].sent
    fixed = await preset_gateway(make_gw, fakes, name)
    status, _, body = await fixed.email(lease, "k-auth", body={"provider": name})
    assert status == 200 and len(fakes[name].sent) == 1


async def test_a_provider_too_slow_to_answer_leaves_the_email_unknown(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw, lease = await gateway_with(make_gw, fakes, "postmark")
    fake = fakes["postmark"]
    fake.delay = 3.0  # past the provider's timeout_seconds (1 s)
    status, _, body = await gw.email(lease, "k-slow", body={"provider": "postmark"})
    assert status == 504 and body["code"] == "provider_timeout"
    fake.delay = 0.0
    status, _, body = await gw.email(lease, "k-slow", body={"provider": "postmark"})
    assert status == 409 and body["code"] == "effect_outcome_unknown"
    assert len(fake.sent) == 1


async def test_a_stale_fence_never_reaches_the_provider(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw = await preset_gateway(make_gw, fakes, "sendgrid")
    old = await gw.leases.claim("run:1", ttl=30)
    assert old is not None
    await gw.leases.release(old.resource, old.owner, old.fence)
    new = await gw.leases.claim("run:1", ttl=30)
    assert new is not None
    status, _, body = await gw.email(old, "k-zombie", body={"provider": "sendgrid"})
    assert status == 412 and body["code"] == "stale_fence"
    assert not fakes["sendgrid"].requests


async def test_email_names_an_email_provider_or_the_only_one(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw, lease = await gateway_with(make_gw, fakes, "resend")
    status, _, body = await gw.email(lease, "k-none")
    assert status == 400 and body["field"] == "provider"  # mail (smtp) and resend
    status, _, body = await gw.email(lease, "k-crm", body={"provider": "crm"})
    assert status == 400 and "not a configured email provider" in body["detail"]
    assert not fakes["resend"].requests
