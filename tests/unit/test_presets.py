"""Presets: every one parses into what its provider documents, the file can
narrow but never widen what is safe, and the email APIs' pure parts."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from gateway import config
from gateway.api.email_body import email_request
from gateway.api.problems import Problem
from gateway.config import fill, presets
from gateway.effects import fingerprint
from gateway.errors import ConfigError
from gateway.providers import http_email
from gateway.providers.base import EmailCall
from gateway.providers.email_apis import EMAIL_APIS
from gateway.providers.mime import build_message

ENV = {"RESEND_API_KEY": "re_x", "POSTMARK_SERVER_TOKEN": "pm_x", "SENDGRID_API_KEY": "SG.x",
       "MAILGUN_API_KEY": "key-x", "HUBSPOT_ACCESS_TOKEN": "pat-x",
       "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}
#: the least a table needs for each preset
MINIMAL: dict[str, dict[str, Any]] = {
    "resend": {"kind": "http"}, "postmark": {"kind": "http"}, "sendgrid": {"kind": "http"},
    "mailgun": {"kind": "http", "domain": "mg.example.com"},
    "ses": {"kind": "http", "region": "eu-west-1"}, "hubspot": {"kind": "http"},
    "resend-smtp": {"kind": "smtp"}, "smtp-relay": {"kind": "smtp", "host": "relay.example"},
}


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


def parsed(name: str, **keys: Any) -> config.ProviderConfig:
    table = {**MINIMAL[name], "preset": name, **keys}
    return config.parse({"providers": {name: table}}, "gw.toml").providers[name]


def test_every_preset_is_tested_here() -> None:
    assert set(MINIMAL) == set(presets.PRESETS)


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_every_preset_parses_into_what_its_provider_documents(name: str) -> None:
    preset = presets.PRESETS[name]
    p = parsed(name)
    assert p.preset is preset and p.kind == preset.kind
    assert p.idempotency_header == preset.idempotency.header
    assert p.retry_window_seconds == (preset.idempotency.window_seconds
                                      if preset.idempotency.header else 0)
    # every fact has its page, and "not acted" and "unknown" never overlap
    assert {"send", "smtp", "submission", "base_url"} & set(preset.sources)
    assert not preset.not_acted_statuses & preset.unknown_statuses
    assert presets.DEFAULT_NOT_ACTED_STATUSES <= preset.not_acted_statuses
    assert presets.DEFAULT_UNKNOWN_STATUSES <= preset.unknown_statuses
    if isinstance(p, config.HttpProviderConfig):
        assert p.base_url.startswith("https://")
        assert p.not_acted_statuses == preset.not_acted_statuses
        assert p.pace == preset.pace
        assert p.email == (preset.email_api is not None) == p.serves_email
    else:
        assert p.port == preset.port and p.tls == preset.tls


@pytest.mark.parametrize(("name", "header", "value"), [
    ("resend", "Authorization", "Bearer re_x"),
    ("sendgrid", "Authorization", "Bearer SG.x"),
    ("hubspot", "Authorization", "Bearer pat-x"),
    ("postmark", "X-Postmark-Server-Token", "pm_x"),
    ("mailgun", "Authorization", "Basic " + base64.b64encode(b"api:key-x").decode()),
])
def test_the_secret_comes_from_the_environment_as_the_provider_wants_it(
        name: str, header: str, value: str) -> None:
    p = parsed(name)
    assert isinstance(p, config.HttpProviderConfig)
    assert dict(p.auth_headers) == {header: value}
    assert value not in repr(p)


def test_ses_signs_with_aws_credentials_for_its_region() -> None:
    p = parsed("ses")
    assert isinstance(p, config.HttpProviderConfig)
    assert p.base_url == "https://email.eu-west-1.amazonaws.com"
    assert p.aws == fill.AwsCredentials("AKIDEXAMPLE", "secret", None)
    assert not p.auth_headers and "secret" not in repr(p)


def test_resend_over_smtp_logs_in_as_resend_and_names_its_key_in_the_message() -> None:
    p = parsed("resend-smtp")
    assert isinstance(p, config.SmtpProviderConfig)
    assert (p.host, p.port, p.tls, p.username, p.password) == \
        ("smtp.resend.com", 465, "tls", "resend", "re_x")
    assert p.idempotency_header == "Resend-Idempotency-Key"


def test_a_base_url_may_point_elsewhere_and_the_window_may_shrink() -> None:
    p = parsed("resend", base_url="http://127.0.0.1:9999", idempotency_window_seconds=3600)
    assert isinstance(p, config.HttpProviderConfig)
    assert p.base_url == "http://127.0.0.1:9999" and p.retry_window_seconds == 3600
    assert parsed("resend", idempotency_header="").retry_window_seconds == 0


@pytest.mark.parametrize(("name", "keys", "where", "says"), [
    ("resend", {"idempotency_window_seconds": 2 * 86400}, "idempotency_window_seconds",
     "longer than the 86400 s"),
    ("resend", {"idempotency_header": "X-Other-Key"}, "idempotency_header",
     "dedupes on 'Idempotency-Key' only"),
    ("postmark", {"idempotency_header": "Idempotency-Key"}, "idempotency_header",
     "documents no idempotency key"),
    ("hubspot", {"email": True}, "email", "no email API"),
    ("resend", {"authorization_env": "X"}, "authorization_env", "authenticates itself"),
    ("resend", {"api_key_env": "FENCEGATE_TEST_UNSET"}, "api_key_env",
     "FENCEGATE_TEST_UNSET, which is not set"),
    ("mailgun", {"domain": "not a domain"}, "domain", "sending domain"),
    ("ses", {"region": "moon"}, "region", "AWS region"),
    ("resend", {"preset": "sendgird"}, "preset", "known: hubspot, mailgun"),
    ("resend", {"kind": "smtp", "host": "x"}, "preset", "configures a http provider"),
    ("resend", {"domain": "x.example"}, "domain", "not a known key"),
])
def test_a_preset_refuses_what_would_be_unsafe_or_wrong(
        name: str, keys: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parsed(name, **keys)
    assert f"gw.toml: providers.{name}.{where}: " in str(e.value)
    assert says in str(e.value)


def test_a_default_secret_that_is_not_set_says_whose_default_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SENDGRID_API_KEY")
    with pytest.raises(ConfigError, match=r"SENDGRID_API_KEY, which is not set .*sendgrid "
                                          r"preset's default"):
        parsed("sendgrid")


def test_ses_without_botocore_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fill, "installed", lambda module: module != "botocore")
    with pytest.raises(ConfigError, match=r"pip install 'fencegate\[ses\]'"):
        parsed("ses")


def test_the_default_email_provider_is_the_only_one_smtp_or_http() -> None:
    def default(providers: dict[str, Any]) -> str | None:
        return config.parse({"providers": providers}).default_email_provider

    smtp = {"kind": "smtp", "host": "127.0.0.1"}
    resend = {"kind": "http", "preset": "resend"}
    assert default({"resend": resend, "crm": {"kind": "http", "base_url": "http://x"}}) \
        == "resend"
    assert default({"mail": smtp, "resend": resend}) is None
    assert default({"mail": smtp, "resend": {**resend, "email": False}}) == "mail"
    assert default({"crm": {"kind": "http", "preset": "hubspot"}}) is None


# ---- attachments -------------------------------------------------------------

def email_body(**over: Any) -> dict[str, Any]:
    return {"from": "a@example.com", "to": ["b@example.com"], "subject": "S", "text": "T",
            **over}


@pytest.mark.parametrize(("attachments", "field"), [
    ("x", "attachments"),
    ([{"filename": "a.txt"}], "attachments[0].content"),
    ([{"filename": "a.txt", "content": "a b"}], "attachments[0].content"),
    ([{"filename": "../etc/passwd", "content": ""}], "attachments[0].filename"),
    ([{"filename": "a\r\nX: y", "content": ""}], "attachments[0].filename"),
    ([{"filename": "", "content": ""}], "attachments[0].filename"),
    ([{"filename": "a", "content": "", "content_type": "text"}], "attachments[0].content_type"),
    ([{"filename": "a", "content": "", "inline": True}], "attachments[0].inline"),
    ([{"filename": "a", "content": ""}] * 51, "attachments"),
])
def test_attachments_are_checked_and_the_field_named(attachments: Any, field: str) -> None:
    with pytest.raises(Problem) as e:
        email_request(email_body(attachments=attachments))
    assert e.value.extra["field"] == field


def test_an_attachment_type_defaults_from_its_name() -> None:
    req = email_request(email_body(attachments=[
        {"filename": "a.pdf", "content": base64.b64encode(b"%PDF").decode()},
        {"filename": "blob", "content": ""}]))
    assert [(a.content_type, a.content) for a in req.attachments] == \
        [("application/pdf", b"%PDF"), ("application/octet-stream", b"")]


def call_of(**over: Any) -> EmailCall:
    body = email_body(cc=["c@example.com"], bcc=["hidden@example.com"], html="<p>T</p>",
                      reply_to="r@example.com", headers={"X-Campaign": "c1"}, **over)
    return EmailCall("agents", "k1", "run:1", 7, email=email_request(body))


def test_the_mime_message_carries_the_attachments() -> None:
    import email
    import email.policy

    call = call_of(attachments=[{"filename": "r.csv", "content": base64.b64encode(b"1,2").decode(),
                                 "content_type": "text/csv"}])
    msg = email.message_from_bytes(build_message(call, ""), policy=email.policy.default)
    assert msg["Message-ID"] == fingerprint.message_id("agents", "k1") and msg["Bcc"] is None
    [attached] = list(msg.iter_attachments())
    assert (attached.get_filename(), attached.get_content_type(),
            attached.get_payload(decode=True)) == ("r.csv", "text/csv", b"1,2")


# ---- the email APIs' requests and answers --------------------------------------------

def built(api: str, **keys: Any) -> Any:
    table = {**MINIMAL[api], "preset": api, **keys}
    p = config.parse({"providers": {api: table}}).providers[api]
    assert isinstance(p, config.HttpProviderConfig)
    return asyncio.run(EMAIL_APIS[api].build(call_of(), p)), p


def test_sendgrid_wants_one_personalization_and_text_before_html() -> None:
    request, _ = built("sendgrid")
    body = json.loads(request.body)
    assert request.path == "v3/mail/send"
    assert body["personalizations"] == [{"to": [{"email": "b@example.com"}],
                                         "cc": [{"email": "c@example.com"}],
                                         "bcc": [{"email": "hidden@example.com"}]}]
    assert [c["type"] for c in body["content"]] == ["text/plain", "text/html"]
    assert body["headers"]["Message-ID"] == fingerprint.message_id("agents", "k1")


def test_postmark_wants_comma_separated_recipients_and_a_header_list() -> None:
    request, _ = built("postmark")
    body = json.loads(request.body)
    assert (request.path, request.headers) == ("email", {"Accept": "application/json"})
    assert (body["To"], body["Cc"], body["Bcc"]) == \
        ("b@example.com", "c@example.com", "hidden@example.com")
    assert {"Name": "Fence-Token", "Value": "7"} in body["Headers"]


def test_mailgun_posts_a_form_to_its_domain() -> None:
    request, _ = built("mailgun")
    assert request.path == "v3/mg.example.com/messages"
    assert request.content_type.startswith("multipart/form-data; boundary=")
    assert b'name="h:Fence-Token"' in request.body and b'name="bcc"' in request.body


def test_ses_sends_the_mime_message_with_bcc_only_in_the_envelope() -> None:
    request, _ = built("ses")
    body = json.loads(request.body)
    assert request.path == "v2/email/outbound-emails"
    assert body["Destination"]["BccAddresses"] == ["hidden@example.com"]
    raw = base64.b64decode(body["Content"]["Raw"]["Data"])
    assert b"hidden@example.com" not in raw and b"Fence-Token: 7" in raw


def test_sigv4_headers_are_added_by_botocore() -> None:
    from gateway.providers import sigv4

    request, p = built("ses")
    signed = sigv4.sign(p, "POST", p.base_url + "/" + request.path,
                        {"Content-Type": "application/json"}, request.body)
    assert signed["Authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") and "/eu-west-1/ses/aws4_request" in \
        signed["Authorization"]
    assert "X-Amz-Date" in signed and "X-Amz-Security-Token" not in signed


@pytest.mark.parametrize(("status", "kind", "code"), [
    (200, "succeeded", None), (202, "succeeded", None),
    (429, "free", "provider_error"), (503, "free", "provider_error"),
    (401, "free", "provider_error"),  # Resend: a refused key sent nothing
    (409, "unknown", "provider_outcome_unknown"),  # Resend: our key is in progress
    (500, "unknown", "provider_outcome_unknown"), (504, "unknown", "provider_timeout"),
    (501, "unknown", "provider_outcome_unknown"), (302, "unknown", "provider_outcome_unknown"),
    (422, "failed", "provider_rejected"), (400, "failed", "provider_rejected"),
])
def test_an_email_apis_answer_is_judged_like_smtps(status: int, kind: str,
                                                   code: str | None) -> None:
    _, p = built("resend")
    out = http_email.judge(p, call_of(), status, {}, b'{"id": "abc"}')
    assert (out.kind, out.code) == (kind, code)
    answer = json.loads(out.body)
    if kind == "succeeded":
        assert answer["provider_message_id"] == "abc"
        assert answer["provider_response"] == {"status": status, "body": {"id": "abc"}}
    else:
        assert answer["provider_status"] == status


def test_a_long_provider_answer_is_cut() -> None:
    _, p = built("resend")
    out = http_email.judge(p, call_of(), 422, {}, b"x" * 10_000)
    assert len(json.loads(out.body)["provider_answer"]) == http_email.ANSWER_EXCERPT
