"""The SMTP envelope (MAIL FROM, RCPT TO) is made only from the addr-specs
the gateway validated, exactly; an address whose display name holds another
address-like token is refused 400 and nothing is sent."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Gw


async def test_the_envelope_is_the_validated_addresses(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-env", body={
        "from": "Agent Smith <agent@example.com>",
        "to": ["Team <team@corp.example>", "lead@example.com"],
        "cc": ["Ops Desk <ops@corp.example>"], "bcc": ["audit@corp.example"]})
    assert status == 200, body
    [d] = gw.smtp.deliveries
    assert d.mail_from == "agent@example.com"
    assert d.recipients == ["team@corp.example", "lead@example.com", "ops@corp.example",
                            "audit@corp.example"]


@pytest.mark.parametrize("field,value", [
    ("to", ["boss@victim.example <team@corp.example>"]),
    ("to", ["root, Team <team@corp.example>"]),
    ("cc", ["a@b.example, <team@corp.example>"]),
    ("bcc", ["x@evil.example <team@corp.example>"]),
    ("from", "ceo@bank.example <agent@example.com>"),
    ("reply_to", "ceo@bank.example <agent@example.com>"),
    ("to", ["Team: <team@corp.example>"]),
    ("to", ["Team (boss@victim.example) <team@corp.example>"]),
])
async def test_a_display_name_holding_another_address_is_refused(
        gw: Gw, field: str, value: object) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-name", body={field: value})
    assert status == 400 and body["code"] == "bad_request", body
    assert gw.smtp.deliveries == []
    assert await gw.effect_state("k-name") is None


@pytest.mark.parametrize("field,value", [
    # "boss@victim.example" in an encoded word: the built To header reads as
    # that address alone (policy.default), and Resend gets the word as it is
    ("to", ["=?utf-8?q?boss=40victim.example?= <team@corp.example>"]),
    # a comma and another address: the To header lists evil@evil.example
    ("to", ["=?utf-8?q?x=2C_evil=40evil.example=2C?= <team@corp.example>"]),
    ("cc", ["=?utf-8?b?PGV2aWxAZXZpbC5leGFtcGxlPiw=?= <team@corp.example>"]),
    ("from", "=?UTF-8?Q?ceo=40bank.example?= <agent@example.com>"),
    ("reply_to", "=?utf-8?q?Team=3A?= <team@corp.example>"),
    # whitespace inside the word: decoded all the same (with a defect)
    ("to", ["=?utf-8?q?boss=40victim .example?= <team@corp.example>"]),
])
async def test_an_encoded_display_name_holding_another_address_is_refused(
        gw: Gw, field: str, value: object) -> None:
    """An RFC 2047 encoded word in a display name is decoded by the email
    package (and by every receiver and email API): what it decodes to is the
    display name, and is held to the same rule as a plain one. Otherwise the
    header the receiver reads names an address nobody validated, although
    the envelope is right."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-name", body={field: value})
    assert status == 400 and body["code"] == "bad_request", body
    assert gw.smtp.deliveries == []
    assert await gw.effect_state("k-name") is None


async def test_an_encoded_display_name_of_plain_words_is_sent(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-plain", body={
        "to": ["=?utf-8?q?Zo=C3=AB_Team?= <team@corp.example>"]})
    assert status == 200, body
    [d] = gw.smtp.deliveries
    assert d.recipients == ["team@corp.example"]


@pytest.mark.parametrize("field,value", [
    ("to", ["zoë@example.com"]),
    ("from", "zoë@example.com"),
    ("cc", ["Zoë <zoë@example.com>"]),
    ("bcc", ["\u0430dmin@example.com"]),  # CYRILLIC SMALL LETTER A, then "dmin"
])
async def test_an_address_that_is_not_ascii_is_refused_before_admission(
        gw: Gw, field: str, value: object) -> None:
    """The address check took any non-ASCII character in the local part, and
    the SMTP provider's MAIL/RCPT encode the envelope in ASCII (no SMTPUTF8):
    UnicodeEncodeError after the admission, 500, the key left in flight (then
    unknown: 409 to every repeat) and the resource behind the drain barrier.
    An addr-spec is printable ASCII (a display name need not be): 400, nothing
    reserved, and the same key is free for the corrected email."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.email(lease, "k-idn", body={field: value})
    assert status == 400 and body["code"] == "bad_request", body
    assert gw.smtp.deliveries == []
    assert await gw.effect_state("k-idn") is None
    status, _, body = await gw.email(lease, "k-idn")
    assert status == 200, body
