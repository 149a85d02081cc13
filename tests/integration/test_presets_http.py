"""``/v1/http`` through presets (HubSpot, Resend's own API), and the SMTP
presets, against fakes and the SMTP sink."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.dev.sinks import SmtpSink
from gateway.effects import fingerprint
from tests.integration.conftest import (
    PROVIDER_TIMEOUT,
    SIGNING_SECRET,
    Gw,
    gateway_with,
    preset_provider,
)
from tests.support.fake_providers import FakeHubSpot, FakeProvider, FakeResend

MakeGw = Callable[..., Awaitable[Gw]]
CONTACT = {"properties": {"email": "lead@example.com", "firstname": "Ada"}}


async def test_a_crm_write_goes_through_the_hubspot_preset_once(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw, lease = await gateway_with(make_gw, fakes, "hubspot", resource="lead:42")
    fake = fakes["hubspot"]
    assert isinstance(fake, FakeHubSpot)
    path = "/v1/http/hubspot/crm/v3/objects/contacts"
    status, _, body = await gw.post(path, gw.headers(lease, "contact-42"), json=CONTACT)
    assert status == 201 and body["properties"] == CONTACT["properties"], body
    assert len(fake.created) == 1
    sent_headers = fake.created[0][1]
    # the preset's token replaced the caller's gateway key; the fence went along
    assert sent_headers["Authorization"] == f"Bearer {FakeHubSpot.secret}"
    assert sent_headers["Fence-Token"] == str(lease.fence)
    # HubSpot documents no idempotency key: none is sent
    assert "Idempotency-Key" not in sent_headers
    again = await gw.post(path, gw.headers(lease, "contact-42"), json=CONTACT)
    assert again[0] == 201 and again[1]["Idempotent-Replayed"] == "true"
    assert len(fake.created) == 1


async def test_a_hubspot_timeout_answer_leaves_the_write_unknown(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """HubSpot's 502/504 "timeouts" may follow the write: no resend."""
    gw, lease = await gateway_with(make_gw, fakes, "hubspot", resource="lead:42")
    fake = fakes["hubspot"]
    assert isinstance(fake, FakeHubSpot)
    fake.fail_next(504, {"status": "error", "message": "timeout"}, acted=True)
    path = "/v1/http/hubspot/crm/v3/objects/contacts"
    status, _, body = await gw.post(path, gw.headers(lease, "contact-43"), json=CONTACT)
    assert status == 504 and body["code"] == "provider_timeout"
    status, _, body = await gw.post(path, gw.headers(lease, "contact-43"), json=CONTACT)
    assert status == 409 and body["code"] == "effect_outcome_unknown"
    assert len(fake.created) == 1


async def test_resends_own_api_through_http_carries_its_idempotency_key(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw, lease = await gateway_with(make_gw, fakes, "resend")
    fake = fakes["resend"]
    assert isinstance(fake, FakeResend)
    email = {"from": "a@example.com", "to": ["b@example.com"], "subject": "S", "text": "T"}
    status, _, body = await gw.post("/v1/http/resend/emails", gw.headers(lease, "raw-1"),
                                    json=email)
    assert status == 200 and body["id"] == fake.sent[0].id
    assert fake.sent[0].request_header("Idempotency-Key") == \
        fingerprint.derived_key("agents", "raw-1")
    assert fake.sent[0].request_header("Authorization") == f"Bearer {FakeResend.secret}"


async def test_an_email_api_request_is_signed_the_standard_webhooks_way(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    from standardwebhooks import Webhook

    gw = await make_gw(providers={"resend": preset_provider(
        "resend", fakes["resend"], signing_secret_env="FENCEGATE_TEST_SIGNING_SECRET")})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, _ = await gw.email(lease, "signed-1", body={"provider": "resend"})
    assert status == 200
    sent = fakes["resend"].sent[0]
    headers = {k.lower(): v for k, v in sent.request_headers.items()}
    assert headers["webhook-id"] == fingerprint.derived_key("agents", "signed-1")
    assert Webhook(SIGNING_SECRET).verify(sent.request_body, headers)["subject"] == "Hello"


async def test_ses_through_http_is_signed_too(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    """Any request to the ses preset is SigV4-signed after every other header,
    the caller's forwarded ones included; the fake checks the signature."""
    gw, lease = await gateway_with(make_gw, fakes, "ses")
    raw = b"From: a@example.com\r\nTo: b@example.com\r\nSubject: raw\r\n\r\nhi\r\n"
    status, _, body = await gw.post(
        "/v1/http/ses/v2/email/outbound-emails",
        {**gw.headers(lease, "ses-raw-1"), "X-Caller-Header": "kept"},
        json={"Destination": {"ToAddresses": ["b@example.com"]},
              "Content": {"Raw": {"Data": base64.b64encode(raw).decode()}}})
    assert status == 200 and body["MessageId"] == fakes["ses"].sent[0].id, body
    signed = fakes["ses"].sent[0].request_header("Authorization") or ""
    assert "x-caller-header" in signed and "fence-token" in signed


async def test_the_smtp_relay_preset_sends_attachments_to_a_relay(
        make_gw: MakeGw, smtp_sink: SmtpSink) -> None:
    """``smtp-relay`` fills in submission's port and STARTTLS; a loopback
    relay without TLS overrides both."""
    relay: dict[str, Any] = {"kind": "smtp", "preset": "smtp-relay", "host": "127.0.0.1",
                             "port": smtp_sink.port, "tls": "none",
                             "timeout_seconds": PROVIDER_TIMEOUT}
    gw = await make_gw(providers={"relay": relay})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    data = b"col1,col2\n1,2\n"
    status, _, body = await gw.email(lease, "csv-1", body={
        "provider": "relay",
        "attachments": [{"filename": "report.csv", "content": base64.b64encode(data).decode()}]})
    assert status == 200, body
    assert set(body) == {"status", "message_id", "provider", "provider_message_id",
                         "provider_response"}
    msg = gw.smtp.deliveries[-1]
    assert msg.header("Message-ID") == body["message_id"]
    assert b'filename="report.csv"' in msg.body and base64.b64encode(data) in msg.body


async def test_an_attachment_over_the_body_limit_is_refused_before_anything(
        make_gw: MakeGw, fakes: dict[str, FakeProvider]) -> None:
    gw, lease = await gateway_with(make_gw, fakes, "resend")
    big = base64.b64encode(b"x" * 64 * 1024).decode()  # the tests' limit is 64 KiB
    status, _, body = await gw.email(lease, "big-1", body={
        "provider": "resend", "attachments": [{"filename": "big.bin", "content": big}]})
    assert status == 413 and body["code"] == "payload_too_large"
    status, _, body = await gw.email(lease, "bad-1", body={
        "provider": "resend", "attachments": [{"filename": "a.txt", "content": "not base64!"}]})
    assert status == 400 and body["field"] == "attachments[0].content"
    assert not fakes["resend"].requests
