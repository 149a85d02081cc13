"""The request as sent, in brief (gateway/effects/summary.py): bounded,
whatever the request, and without its secrets, bodies or header values."""

from __future__ import annotations

import json

from gateway.api.email_body import Attachment, EmailRequest
from gateway.effects.summary import MAX_CHARS, MAX_ITEMS, email_summary, http_summary, target
from gateway.providers import EmailCall, HttpCall


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
