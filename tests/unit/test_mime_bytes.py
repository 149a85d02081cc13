"""The message an email effect sends (gateway/providers/mime.py) is the
email package's own: parsing each short header once and keeping it, and
reading the address headers back from the first parse, change how fast it
is built, never a byte of it nor which emails are refused."""

from __future__ import annotations

import email.policy
import gc
import re
import tracemalloc
from collections.abc import Callable
from email.parser import BytesParser
from email.policy import compat32
from functools import partial
from typing import Any

import pytest

from gateway.api.email_body import Attachment, EmailRequest
from gateway.providers import mime
from gateway.providers.base import EmailCall

_BOUNDARY = re.compile(rb"=+[0-9]{10,}==")


def _request(**over: object) -> EmailRequest:
    fields: dict[str, object] = {
        "provider": None, "sender": "Agent <agent@example.com>", "to": ["a@example.com"],
        "cc": [], "bcc": [], "reply_to": None, "subject": "Hello", "text": "the body",
        "html": None, "headers": {}}
    fields.update(over)
    return EmailRequest(**fields)  # type: ignore[arg-type]


EMAILS = [
    _request(),
    _request(to=["Zoë Ünicode <z@example.com>", "b@example.com"], cc=["c@example.com"],
             reply_to="Replies <r@example.com>", subject="Grüße, " + "long words " * 30,
             html="<p>hi</p>", headers={"X-Campaign": "spring", "X-Long": "v " * 120}),
    _request(text=None, html="<p>only html</p>", subject="=?utf-8?q?encoded?= word"),
    _request(attachments=(Attachment("report.pdf", "application/pdf", b"%PDF-1.4 " * 40),
                          Attachment("ünï.txt", "text/plain", b"hello"))),
    _request(sender="Last First <first@example.com>", subject="x" * 300),
]

#: display names the request checks refuse (built here without them): each
#: either builds or is refused, the same way every time, with or without
#: the kept headers; one longer than ``PARSED_CHARS``, never kept
HOSTILE = [
    _request(sender="=?utf-8?q?evil=40attacker.example?= <agent@example.com>"),
    _request(to=["=?utf-8?q?=22b=40evil=2Eexample=22?= <a@example.com>"]),
    _request(to=["=?utf-8?q?x=3Cb=40evil.example=3E?= <a@example.com>"]),
    _request(to=["=?utf-8?q?a=2C_b=40evil=2Eexample?= <a@example.com>"]),
    _request(to=["=?utf-8?q?G=3A_b=40evil=2Eexample=3B?= <a@example.com>"]),
    _request(to=["=?utf-8?q?Gr=C3=BC=C3=9Fe?= <a@example.com>"]),
    _request(to=["=?utf-8?q?" + "=41" * 100 + "=40evil=2Eexample?= <a@example.com>"]),
    _request(cc=["=?utf-8?b?PGJAZXZpbC5leGFtcGxlPg==?= <c@example.com>"]),
    _request(reply_to=". <r@example.com>"),
    _request(sender="=?utf-8?q?a=2C_b=40evil=2Eexample?= <agent@example.com>"),
]


def _call(req: EmailRequest) -> EmailCall:
    return EmailCall("agents", "k1", "run:1", 7, email=req)


def _normalised(data: bytes) -> bytes:
    return _BOUNDARY.sub(b"BOUNDARY", data)


def _outcome(req: EmailRequest) -> bytes | str:
    try:
        return _normalised(mime.build_message(_call(req), "X-Idem"))
    except mime.Unbuildable as e:
        return f"refused: {e}"


@pytest.fixture(autouse=True)
def _one_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mime, "formatdate", lambda usegmt: "Thu, 03 Dec 2026 05:00:00 GMT")


@pytest.mark.parametrize("req", EMAILS)
def test_the_bytes_are_the_email_packages_own(req: EmailRequest,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Cold and warm (every header already kept), the message is byte for
    byte what the stdlib's SMTP policy writes, boundaries aside."""
    cold, warm = _outcome(req), _outcome(req)
    with monkeypatch.context() as m:
        m.setattr(mime, "SMTP_POLICY", email.policy.SMTP)
        plain = _outcome(req)
    assert isinstance(plain, bytes)
    assert cold == plain and warm == plain


@pytest.mark.parametrize("req", HOSTILE)
def test_a_hostile_email_gets_the_same_answer_every_time(
        req: EmailRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused or built, the same as the stdlib's uncached policy answers,
    the first time and every time after (a header is never kept from a
    parse that raised, nor kept in a form that passes a later check)."""
    answers = [_outcome(req) for _ in range(3)]
    with monkeypatch.context() as m:
        m.setattr(mime, "SMTP_POLICY", email.policy.SMTP)
        plain = _outcome(req)
    assert answers == [plain] * 3
    assert "AssertionError" not in str(plain)  # the address is one address() accepts


def _read(headers: Callable[[], Any]) -> object:
    """What the header objects ``headers()`` gives say, comparably: each
    one's text, its defects and its addresses; or which exception parsing
    or reading them raised."""
    try:
        return [(str(h), [repr(d) for d in h.defects],
                 [a.addr_spec for a in getattr(h, "addresses", ())]) for h in headers()]
    except Exception as e:
        return f"raises {type(e).__name__}"


@pytest.mark.parametrize("req", EMAILS + HOSTILE)
def test_address_headers_read_back_as_a_second_parse_would(req: EmailRequest) -> None:
    """The address check reads the headers of the parse it already made,
    as the SMTP policy would: the same headers, defects and addresses, in
    the same order, as parsing the bytes again under that policy."""
    try:
        data = mime._message(_call(req), "").as_bytes(policy=mime.SMTP_POLICY)
    except Exception:
        return  # the email package cannot build it: refused before any read-back
    first = BytesParser(policy=compat32).parsebytes(data)
    second = BytesParser(policy=email.policy.SMTP).parsebytes(data, headersonly=True)
    for name in ("From", "To", "Cc", "Reply-To", "Subject"):
        assert _read(partial(mime._read_back, first, name)) == \
            _read(partial(second.get_all, name, []))


def test_what_the_kept_headers_hold_is_bounded_whatever_the_callers_send() -> None:
    """A header's parse holds about a kilobyte per character of an address
    list: 2,048 kept To headers of 32 short addresses each held 530 MiB, all
    from requests refused or not (headers are built before the admission).
    A caller's own header of an address type (``Resent-To``), its syntax
    unchecked, can hold 2.5 KB a character. What is kept is the validated
    headers, bounded by their characters, however many distinct ones
    arrive."""
    factory = mime.SMTP_POLICY.header_factory
    assert isinstance(factory, mime._HeaderClasses)
    factory.forget()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(60):  # 60 To headers of 248 characters: 15 MiB, all kept
            to = [f"{i:03x}@e.co"] + ["a@e.co"] * 30
            mime.build_message(_call(_request(to=to, subject=f"s{i}")), "")
        for i in range(25):  # 25 of an unchecked syntax, 2.5 KB a character: 16 MiB
            with pytest.raises(mime.Unbuildable):
                mime.build_message(_call(_request(headers={
                    "Resent-To": f"{i:03x}" + ",é" * 125})), "")
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert factory.kept_chars <= mime.KEPT_CHARS
    assert held < 12 * 2**20, held  # the bound, about 8 MiB, and some slack
