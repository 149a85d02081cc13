"""Pure parts of the gateway: config validation, request checks, fingerprints,
the rate limiter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import config
from gateway.api import email_body, parsing
from gateway.api.problems import Problem
from gateway.effects import fingerprint
from gateway.effects.ratelimit import TokenBucket

GOOD = {
    "server": {"port": 8080},
    "clients": [{"name": "agents", "key_sha256": "a" * 64, "resources": ["run:*"]}],
    "providers": {
        "mail": {"kind": "smtp", "host": "127.0.0.1", "port": 2525},
        "crm": {"kind": "http", "base_url": "http://127.0.0.1:9000/api"},
    },
}


def _with(path: str, value: Any) -> dict[str, Any]:
    import copy

    data = copy.deepcopy(GOOD)
    node: Any = data
    *parents, last = path.split(".")
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[last] = value
    return data


def test_a_good_config_parses_with_defaults() -> None:
    c = config.parse(GOOD, "f.toml")
    assert c.default_email_provider == "mail"
    assert c.providers["crm"].idempotency_header == "Idempotency-Key"
    assert c.providers["mail"].idempotency_header == ""
    assert c.providers["mail"].retry_window_seconds == 0


@pytest.mark.parametrize(("path", "value", "where"), [
    ("server.port", "80", "server.port"),
    ("server.port", 70000, "server.port"),
    ("server.nope", 1, "server.nope"),
    ("clients.0.key_sha256", "short", "clients[0].key_sha256"),
    ("clients.0.resources", [], "clients[0].resources"),
    ("providers.mail.kind", "fax", "providers.mail.kind"),
    ("providers.mail.tls", "ssl", "providers.mail.tls"),
    ("providers.crm.base_url", "ftp://x", "providers.crm.base_url"),
    ("providers.crm.password_env", "X", "providers.crm.password_env"),
    ("providers.crm.signing_secret_env", "FENCEGATE_TEST_UNSET_VAR",
     "providers.crm.signing_secret_env"),
])
def test_config_errors_name_the_file_and_key(path: str, value: Any, where: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.parse(_with(path, value), "f.toml")
    assert str(err.value).startswith(f"f.toml: {where}:")


def test_config_load_reports_bad_toml(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[server\nport = 1")
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.load(p)
    with pytest.raises(config.ConfigError, match="no such file"):
        config.load(tmp_path / "missing.toml")


def test_secrets_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMTP_PASSWORD_TEST", "hunter2")
    data = _with("providers.mail.password_env", "SMTP_PASSWORD_TEST")
    data["providers"]["mail"]["tls"] = "starttls"
    c = config.parse(data)
    assert c.providers["mail"].password == "hunter2"
    assert "hunter2" not in repr(c)


def test_smtp_credentials_without_tls_are_refused_unless_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A password over plain SMTP is readable by anyone on the path."""
    monkeypatch.setenv("SMTP_PASSWORD_TEST", "hunter2")
    data = _with("providers.mail.password_env", "SMTP_PASSWORD_TEST")
    with pytest.raises(config.ConfigError, match=r"providers\.mail\.tls: .*clear text"):
        config.parse(data, "f.toml")
    data["providers"]["mail"]["allow_plaintext_auth"] = True
    assert config.parse(data).providers["mail"].password == "hunter2"


def test_a_signing_secret_must_be_base64_as_standard_webhooks_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIGNING_TEST", "not base64 at all!")
    with pytest.raises(config.ConfigError, match=r"providers\.crm\.signing_secret_env: .*base64"):
        config.parse(_with("providers.crm.signing_secret_env", "SIGNING_TEST"), "f.toml")
    for good in ("c2VjcmV0LWtleQ==", "whsec_c2VjcmV0LWtleQ=="):
        monkeypatch.setenv("SIGNING_TEST", good)
        cfg = config.parse(_with("providers.crm.signing_secret_env", "SIGNING_TEST"))
        assert config.signing_key(cfg.providers["crm"].signing_secret or "") == b"secret-key"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@given(json_values)
def test_canonical_json_ignores_key_order_and_spacing(value: Any) -> None:
    import json

    compact = json.dumps(value).encode()
    spaced = json.dumps(value, indent=3).encode()
    assert fingerprint.canonical_body(compact, "application/json") == \
        fingerprint.canonical_body(spaced, "application/json; charset=utf-8")


@given(st.text(max_size=20), st.text(max_size=20), st.text(max_size=20), st.text(max_size=20))
def test_fingerprints_do_not_collide_across_field_boundaries(a: str, b: str, c: str,
                                                             d: str) -> None:
    if (a, b) != (c, d):
        assert fingerprint.fingerprint(a, "POST", b, b"") != \
            fingerprint.fingerprint(c, "POST", d, b"")


def test_derived_keys_are_stable_and_scoped_per_client() -> None:
    assert fingerprint.derived_key("a", "k") == fingerprint.derived_key("a", "k")
    assert fingerprint.derived_key("a", "k") != fingerprint.derived_key("b", "k")
    assert fingerprint.message_id("a", "k").startswith("<")


@pytest.mark.parametrize("addr", ["a@example.com", "Ann <a@example.com>",
                                  "a.b+c@sub.example.co"])
def test_good_addresses(addr: str) -> None:
    assert email_body.address("to", addr) == addr


@pytest.mark.parametrize(("addr", "parts"), [
    ("a@example.com", ("", "a@example.com")),
    ("  Ann Lee <a@example.com> ", ("Ann Lee", "a@example.com")),
    ("J. Smith<j@example.com>", ("J. Smith", "j@example.com")),
])
def test_mailbox_is_what_the_check_validated(addr: str, parts: tuple[str, str]) -> None:
    assert email_body.mailbox(email_body.address("to", addr)) == parts


@pytest.mark.parametrize("addr", ["", "a", "a@", "@b", "a@b\r\nBcc: x@y", "a b@c",
                                  'A <a@b> "x"', "a@-b..c", 5,
                                  # a display name that reads as another address
                                  "boss@victim.example <a@b.example>", "root, Team <a@b.example>",
                                  "Team: <a@b.example>", "T (x@y.example) <a@b.example>",
                                  "=?utf-8?q?a=0D=0Ab?= <a@b.example>", "A\u2028B <a@b.example>",
                                  # a domain that ends in a dot: no SMTP domain
                                  "a@b.example.", "Ann <a@b.example.>"])
def test_bad_addresses(addr: Any) -> None:
    with pytest.raises(Problem) as p:
        email_body.address("to", addr)
    assert p.value.code == "bad_request"


@pytest.mark.parametrize("path", ["a/b", "contacts/7/notes", "a%20b", "x.json"])
def test_provider_paths_that_stay_inside(path: str) -> None:
    assert parsing.provider_path(path) == path


@pytest.mark.parametrize("path", ["../a", "a/../../b", "%2e%2e/a", "a/%2E%2E", "/abs",
                                  "http://x/y", "a\\b", "%252e%252e/a", "a/./b", "a\r\nb",
                                  # not plain: overlong UTF-8, full-width and other
                                  # Unicode dots, raw or encoded, any non-ASCII byte
                                  "%c0%ae%c0%ae/a", "a/%C0%AE/b", "%e0%80%ae/a",
                                  "\uff0e\uff0e/a", "%ef%bc%8e%ef%bc%8e/a", "a/\u2024\u2024/b",
                                  "%e2%80%a4/a", "caf%C3%A9", "caf\u00e9", "a/%80/b", "a%7fb"])
def test_provider_paths_that_would_escape(path: str) -> None:
    with pytest.raises(Problem):
        parsing.provider_path(path)


def test_token_bucket_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=2, burst=2)
    assert bucket.take(0.0) == 0 and bucket.take(0.0) == 0
    wait = bucket.take(0.0)
    assert wait == pytest.approx(0.5)
    assert bucket.take(0.5) == 0


@given(st.floats(min_value=0.1, max_value=1000), st.lists(
    st.floats(min_value=0, max_value=10), min_size=1, max_size=50))
def test_token_bucket_never_exceeds_burst_plus_rate(rate: float, gaps: list[float]) -> None:
    bucket = TokenBucket(rate=rate, burst=max(1.0, rate))
    now, taken = 0.0, 0
    for gap in gaps:
        now += gap
        if bucket.take(now) == 0:
            taken += 1
    assert taken <= max(1.0, rate) + rate * now + 1e-6


def test_an_email_carries_its_message_id_fence_and_provider_key() -> None:
    import email

    from gateway.providers.base import EmailCall
    from gateway.providers.smtp import build_message

    req = email_body.email_request({"from": "A <a@example.com>", "to": ["b@example.com"],
                                    "bcc": ["hidden@example.com"], "subject": "Hi",
                                    "text": "t", "html": "<p>t</p>",
                                    "headers": {"X-Campaign": "c1"}})
    call = EmailCall(client="agents", key="k1", resource="run:1", fence=7, email=req)
    msg = email.message_from_bytes(build_message(call, "Resend-Idempotency-Key"))
    assert msg["Message-ID"] == fingerprint.message_id("agents", "k1")
    assert msg["Resend-Idempotency-Key"] == fingerprint.derived_key("agents", "k1")
    assert (msg["Fence-Resource"], msg["Fence-Token"]) == ("run:1", "7")
    assert msg["X-Campaign"] == "c1" and msg["Bcc"] is None  # bcc only in the envelope
    assert "hidden@example.com" in req.recipients


def test_the_gateways_http_headers_replace_the_callers_in_any_letter_case() -> None:
    """Each header the gateway sets on an HTTP effect (the idempotency header
    by its configured name, the fence and signing headers) appears once in
    what it hands the client library, with the gateway's value, whatever the
    letter case of a caller's copy."""
    from gateway.providers.base import HttpCall
    from gateway.providers.http import HttpProvider

    cfg = config.parse(_with("providers.crm.idempotency_header", "X-Request-Token"),
                       "f.toml").providers["crm"]
    assert isinstance(cfg, config.HttpProviderConfig)
    call = HttpCall("agents", "k", "run:1", 3, method="POST", path="a", query="",
                    headers={"x-request-token": "forged", "X-Trace": "t"})
    headers = HttpProvider(cfg, 1024).headers(call)
    token = [v for k, v in headers.items() if k.lower() == "x-request-token"]
    assert token == [fingerprint.derived_key("agents", "k")]
    assert headers["X-Trace"] == "t"


@pytest.mark.parametrize("over", [
    {"subject": "=?utf-8?q?invoice=0D=0ABcc:_hidden@evil.example?="},
    {"subject": "=?utf-8?q?x=0D=0A=0D=0Abody?="},
    {"headers": {"X-Campaign": "=?utf-8?q?a=0D=0ABcc:_hidden@evil.example?="}},
    {"attachments": [{"filename": "=?utf-8?q?a=0D=0ABcc:_x@evil.example?=.pdf",
                      "content": "AAAA"}]},
    {"subject": "Hi\x0bthere"}, {"subject": "Hi\u2028there"},
])
def test_a_built_message_is_read_back_before_it_is_sent(
        monkeypatch: pytest.MonkeyPatch, over: dict[str, Any]) -> None:
    """With the request checks of encoded words and line breaks switched off,
    the message built is still refused: its bytes, read back, must hold
    exactly the headers set, part by part (on an interpreter without the
    CVE-2024-6923 fix the encoded CRLF is written raw; on one with it the
    message reads back whole and is built)."""
    from gateway.providers.base import EmailCall
    from gateway.providers.mime import Unbuildable, build_message

    body = {"from": "a@example.com", "to": ["b@example.com"], "subject": "s", "text": "t",
            **over}
    with pytest.raises(Problem):  # the request checks refuse it...
        email_body.email_request(body)
    # ...and are looked up where the body is checked: switched off, it passes
    monkeypatch.setattr(email_body, "header_text", lambda field, value: value)
    req = email_body.email_request(body)
    call = EmailCall("agents", "k", "run:1", 1, email=req)
    try:
        data = build_message(call, "")
    except Unbuildable:
        return
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    assert b"\r\nbcc:" not in head and b"fence-token:" in head


def test_a_forwarded_header_line_fits_what_a_provider_reads() -> None:
    """aiohttp's servers read a header line of at most 8,190 bytes (its
    pure-Python parser counts the name, ": " and the value): a repeated
    field joined past that was sent, refused by the provider, and the
    refusal recorded as the effect's answer. It is refused before."""
    from gateway.api import parsing

    fits = {"X-Trace": "t" * (parsing.MAX_FIELD_BYTES - len("X-Trace: "))}
    assert parsing.joined_fields_fit(fits) == fits
    for value in ("t" * (parsing.MAX_FIELD_BYTES - 8), "é" * 4091):
        with pytest.raises(Problem):
            parsing.joined_fields_fit({"X-Trace": value})
