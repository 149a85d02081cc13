"""An email the gateway cannot build, or whose built header section would not
be exactly the headers it meant to write, is refused 400 before admission:
nothing is sent, no key is reserved, no drain barrier is raised. That holds
whether or not the interpreter's email package carries the CVE-2024-6923 fix
(encoded words that decode to a line break)."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest

from tests.integration.conftest import Gw

ENCODED_CRLF = "=?utf-8?q?invoice=0D=0ABcc:_hidden@evil.example?="
ENCODED_BLANK_LINE = "=?utf-8?q?x=0D=0A=0D=0Abody?="
ATTACHMENT = base64.b64encode(b"%PDF-1.4").decode()


def _attachment(filename: str) -> dict[str, Any]:
    return {"attachments": [{"filename": filename, "content": ATTACHMENT}]}


ENCODED_WORDS = [
    {"subject": ENCODED_CRLF},
    {"subject": ENCODED_BLANK_LINE},
    {"subject": "=?utf-8?b?" + base64.b64encode(b"a\r\nBcc: x@evil.example").decode() + "?="},
    {"headers": {"X-Campaign": ENCODED_CRLF}},
    {"headers": {"X-Campaign": ENCODED_BLANK_LINE}},
    {"from": f"{ENCODED_CRLF} <agent@example.com>"},
    {"to": [f"{ENCODED_BLANK_LINE} <lead@example.com>"]},
    _attachment(ENCODED_CRLF + ".pdf"),
    _attachment("=?utf-8?q?a=00b?=.pdf"),
]


@pytest.mark.parametrize("over", ENCODED_WORDS)
async def test_encoded_words_that_decode_to_line_breaks_are_refused(
        gw: Gw, over: dict[str, Any]) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-ew", body=over)
    assert status == 400 and body["code"] == "bad_request", body
    assert gw.smtp.deliveries == []
    assert await gw.effect_state("k-ew") is None


async def test_a_plain_encoded_word_is_sent_with_exactly_the_intended_headers(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-ok", body={
        "subject": "=?utf-8?q?caf=C3=A9?=", "headers": {"X-Campaign": "spring"}})
    assert status == 200, body
    [d] = gw.smtp.deliveries
    assert sorted(k.lower() for k in d.headers) == sorted([
        "from", "to", "subject", "date", "message-id", "fence-resource", "fence-token",
        "x-campaign", "content-type", "content-transfer-encoding", "mime-version"])


BREAKERS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("ch", BREAKERS)
@pytest.mark.parametrize("where", ["subject", "header", "name", "filename"])
async def test_an_unbuildable_email_reserves_nothing(gw: Gw, where: str, ch: str) -> None:
    """Characters the email package breaks header lines at are a 400 before
    admission; the same key with a good body afterwards is a new effect."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    bad: dict[str, Any] = {
        "subject": {"subject": f"Hi{ch}there"},
        "header": {"headers": {"X-Campaign": f"a{ch}b"}},
        "name": {"to": [f"Le{ch}ad <lead@example.com>"]},
        "filename": _attachment(f"a{ch}b.pdf"),
    }[where]
    status, _, body = await gw.email(lease, "k-unbuilt", body=bad)
    assert status == 400 and body["code"] == "bad_request", body
    assert await gw.effect_state("k-unbuilt") is None
    status, _, body = await gw.request("GET", "/v1/effects/k-unbuilt",
                                       gw.headers(lease, "k-unbuilt"))
    assert status == 404 and body["code"] == "not_found"
    status, headers, body = await gw.email(lease, "k-unbuilt")
    assert status == 200, body
    assert "Idempotent-Replayed" not in headers
    assert len(gw.smtp.deliveries) == 1


@pytest.mark.parametrize("filename", [
    "=?utf-8?q?..=2F..=2F.bashrc?=",
    "=?utf-8?b?" + base64.b64encode(b"..\\..\\autoexec.bat").decode() + "?=",
    '=?utf-8?q?a=22_b.pdf?=',
])
async def test_an_encoded_filename_is_held_to_the_plain_filename_rule(
        gw: Gw, filename: str) -> None:
    """A filename may not hold a path separator or a quote; receivers decode
    an encoded word in it (the email package's get_filename() reads
    "../../.bashrc"), so what it decodes to is held to the same rule."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-fn", body=_attachment(filename))
    assert status == 400 and body["code"] == "bad_request", body
    assert gw.smtp.deliveries == []
    assert await gw.effect_state("k-fn") is None


@pytest.mark.parametrize("to", [". <team@corp.example>", ".NET Team <team@corp.example>"])
async def test_a_name_the_email_package_trips_on_is_a_400_not_a_500(
        gw: Gw, caplog: pytest.LogCaptureFixture, to: str) -> None:
    """Python 3.11's header parser raises AttributeError (not a ValueError)
    on a display name that starts with a dot; 3.13's builds it. Either way
    the caller gets a clear answer: sent, or 400 with nothing reserved,
    never 500 with a traceback logged."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    with caplog.at_level(logging.INFO):
        status, _, body = await gw.email(lease, "k-dot", body={"to": [to]})
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    if status == 400:
        assert body["code"] == "bad_request", body
        assert gw.smtp.deliveries == [] and await gw.effect_state("k-dot") is None
    else:
        assert status == 200, body
        [d] = gw.smtp.deliveries
        assert d.recipients == ["team@corp.example"]
