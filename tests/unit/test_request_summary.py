"""The request as sent, in brief (gateway/effects/summary.py): bounded,
whatever the request, and without its secrets, bodies or header values."""

from __future__ import annotations

import json

import pytest

import leases.redact as redact_module
from gateway.api.email_body import Attachment, EmailRequest
from gateway.effects import summary
from gateway.effects.summary import (
    MAX_CHARS,
    MAX_ITEMS,
    email_summary,
    http_summary,
    target,
    text,
)
from gateway.providers import EmailCall, HttpCall
from leases.redact import redact


def _email(**over: object) -> EmailCall:
    fields: dict[str, object] = {
        "provider": None, "sender": "agent@example.com", "to": ["a@example.com"], "cc": [],
        "bcc": [], "reply_to": None, "subject": "Hello", "text": "the body", "html": None,
        "headers": {}}
    fields.update(over)
    return EmailCall("agents", "k", "run:1", 1, email=EmailRequest(**fields))  # type: ignore[arg-type]


def test_every_list_and_string_is_bounded() -> None:
    """A list keeps MAX_ITEMS entries and says how many more; a string keeps
    MAX_CHARS characters: the row stays small whatever the request."""
    many = [f"r{i}@example.com" for i in range(MAX_ITEMS + 5)]
    files = tuple(Attachment(f"f{i}.txt", "text/plain", b"x" * i) for i in range(30))
    s = email_summary(_email(to=many, bcc=many, subject="s" * 5000, attachments=files,
                             headers={f"X-H{i}": "v" for i in range(40)}))
    assert s["to"] == many[:MAX_ITEMS] and s["to_omitted"] == 5
    assert len(s["bcc"]) == MAX_ITEMS and s["bcc_omitted"] == 5
    assert len(s["attachments"]) == MAX_ITEMS and s["attachments_omitted"] == 10
    assert len(s["headers"]) == MAX_ITEMS and s["headers_omitted"] == 20
    assert len(s["subject"]) == MAX_CHARS
    assert len(json.dumps(s)) < 8000


def test_an_email_keeps_sizes_not_bodies_nor_header_values() -> None:
    s = email_summary(_email(text="Dear lead, token=hunter2", html="<b>hi</b>",
                             headers={"X-Secret-Ish": "value-not-kept"},
                             subject="password: hunter2 inside",
                             attachments=(Attachment("q.pdf", "application/pdf", b"%PDF"),)))
    text = json.dumps(s)
    assert "hunter2" not in text and "value-not-kept" not in text and "Dear" not in text
    assert s["subject"] == "password: *** inside"
    assert s["headers"] == ["X-Secret-Ish"]
    assert s["attachments"] == [{"name": "q.pdf", "content_type": "application/pdf",
                                 "bytes": 4}]
    assert (s["text_bytes"], s["html_bytes"]) == (24, 9)


def test_a_query_secret_is_blanked_however_its_name_is_encoded() -> None:
    assert target("contacts/7", "a=1&api_key=sk_live_123&api%5Fkey=zz&token") == \
        "contacts/7?a=1&api_key=***&api%5Fkey=***&token"
    assert target("hooks/sk_live_abcdef", "") == "hooks/sk_***"


def test_an_http_call_keeps_header_names_and_the_bodys_size_only() -> None:
    call = HttpCall("agents", "k", "run:1", 1, method="POST", path="notes", query="x=1",
                    headers={"Authorization": "Bearer t", "X-Trace": "abc", "Host": "h",
                             "Content-Type": "application/json"},
                    body=b'{"note": "secret body"}')
    s = http_summary(call, "application/json")
    assert s == {"kind": "http", "method": "POST", "path": "notes?x=1",
                 "headers": ["X-Trace", "Content-Type"], "body_bytes": 23,
                 "content_type": "application/json"}


#: the most of one string the summary may read: a few lines' worth
HEAD_CHARS = 2048


def _redacted_chars(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every string handed to ``leases.redact`` from now on."""
    seen: list[int] = []

    def counting(value: object) -> object:
        if isinstance(value, str):
            seen.append(len(value))
        return redact(value)

    monkeypatch.setattr(summary, "redact", counting, raising=False)
    monkeypatch.setattr(redact_module, "redact", counting)
    return seen


def test_the_work_is_bounded_whatever_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every string was redacted whole, and every entry of a list, kept or
    not: 128 header names of 8 KB (what aiohttp lets through) took 0.4 s of
    the event loop per request, a megabyte of Bcc display names a quarter
    of a second, before the fence was even checked (a stale or replayed
    request pays it too). Only what is kept is read, and of each string a
    bounded head."""
    seen = _redacted_chars(monkeypatch)
    names = {f"{'a-' * 4000}{i}": "v" for i in range(128)}
    http_summary(HttpCall("agents", "k", "run:1", 1, method="POST", path="x",
                          query="q=" + "://a:" * 1600, headers=names, body=b"{}"),
                 "a" * 8000)
    huge = [f"{'a-' * 25_000} <r{i}@example.com>" for i in range(100)]
    email_summary(_email(to=huge, cc=huge, bcc=huge, sender=huge[0], reply_to=huge[0],
                         subject="s" * 998))
    strings = 2 + MAX_ITEMS + 2 + 3 * MAX_ITEMS + 1  # http, then email
    assert len(seen) <= strings and max(seen) <= HEAD_CHARS, \
        (len(seen), sum(seen))


@pytest.mark.parametrize("value", [
    "see https://bot:" + "p" * 5000 + "@crm.example.com/x",
    "note password='" + "p" * 5000 + "' end",
    'note "token": "' + "p" * 5000 + '" end',
    "Bearer " + "p" * 5000,
    "sk_live_" + "p" * 5000,
])
def test_a_secret_the_cut_leaves_open_is_blanked(value: str) -> None:
    """A string is redacted in its head only: a secret whose end lies past
    the head (a URL's password before its "@", a quoted value before its
    closing quote) is still blanked, to the end of what is shown."""
    assert "ppp" not in text(value)
    assert "ppp" not in text("x " * 75 + value)


@pytest.mark.parametrize("value", ["Audit \ud800 <a@example.com>", "nul\x00here"])
def test_every_summary_can_be_stored_as_jsonb(value: str) -> None:
    """A lone surrogate has no UTF-8 (asyncpg refused the admission: a 500),
    and jsonb refuses \\u0000: whatever a caller's string held, the
    summary's strings can be stored (each such character shown as U+FFFD)."""
    s = email_summary(_email(bcc=[value], subject=value))
    stored = json.dumps(s, ensure_ascii=False)
    stored.encode()
    assert "\\u0000" not in stored and "\ufffd" in s["subject"]


@pytest.mark.parametrize("name", ["key", "hapikey", "KEY", "sig", "auth", "jwt",
                                  "subscription-key", "x-goog-api-key"])
def test_a_query_credential_under_a_short_name_is_blanked(name: str) -> None:
    """Query strings carry credentials under names no payload field would
    use for one: Google's ``key=AIza...``, HubSpot's legacy ``hapikey``, an
    Azure SAS ``sig``, Firebase's ``auth``, a ``jwt``. ``secret_name`` (made
    for field names, where ``key`` alone is ordinary) let them through to
    the console."""
    assert target("maps/geocode", f"address=Main+St&{name}=AIzaSyD-not-for-the-page") == \
        f"maps/geocode?address=Main+St&{name}=***"


@pytest.mark.parametrize("value", [
    "Bearer sk_live_abcdef", "agent@example.com", "https://bot:pw@crm.example.com/x",
    "nul\x00here", "x" * summary.KEPT_CHARS, "password=hunter2",
])
def test_a_string_reads_the_same_the_second_time(value: str) -> None:
    """Short strings are redacted once and the answer kept (the same
    senders and header names come back request after request): what is
    kept is what redacting it afresh gives, every time it is asked."""
    fresh = summary._text(value)
    assert text(value) == fresh and text(value) == fresh


@pytest.mark.parametrize("connection", ["Connection", "connection", "CONNECTION"])
def test_headers_a_connection_header_names_are_never_forwarded(connection: str) -> None:
    """A header the caller's Connection header names is hop by hop (RFC 9110
    7.6.1), however either is spelt: a lowercase ``connection`` left
    the headers it named in the request to the provider (and its summary)."""
    call = HttpCall("agents", "k", "run:1", 1, method="POST", path="x", query="",
                    headers={connection: "keep-alive, X-Hop", "x-hop": "1", "X-Kept": "2"})
    assert call.forwarded == {"X-Kept": "2"}
    assert http_summary(call, None)["headers"] == ["X-Kept"]
