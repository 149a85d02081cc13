"""The request as sent, in brief: what the ledger keeps of an effect's request
(``fencegate_effects.request_summary``) so that an operator resolving an
unknown effect can check with the provider first (the console's effect page,
``fencegate effects show``, ``GET /v1/effects/{key}``).

Pure: built once per effect, from the call the gateway checked, before the
admission that stores it.

What is kept, and what is not:

- email: from, to, cc, bcc, reply-to, subject, the caller's own header names
  (not their values), each attachment's name, type and size, and the sizes of
  the text, the HTML and the whole message; never a body.
- HTTP: method, the path with its query (a query value under a secret-looking
  name blanked, the rest through ``leases.redact``), the forwarded header
  names (never their values), the body's size and content type; never a body.

Every string a caller wrote passes through ``leases.redact`` before it is cut.
Bounded, so a row stays small whatever the request: a list keeps its first
``MAX_ITEMS`` entries (with how many were left off, under ``<name>_omitted``),
a string its first ``MAX_CHARS`` characters (cut after it is redacted, so a
cut never splits a secret out of its pattern's reach). So is the work, which
every request pays before its fence is checked (a replay, a stale fence): only
the entries kept are read, and of a string its first ``REDACTED_CHARS``
(``leases.redact_head``: a secret that cut leaves open is blanked to the end).
What a jsonb string cannot hold (a NUL, a lone surrogate) is shown as U+FFFD.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

from gateway.providers import EmailCall, HttpCall
from leases.redact import MASK, redact_head, secret_name

#: entries kept of each list (recipients, attachments, header names)
MAX_ITEMS = 20
#: characters kept of each string (after redaction)
MAX_CHARS = 200
#: characters read of each string: redacted, then cut to ``MAX_CHARS``
REDACTED_CHARS = 512
#: strings this long or shorter are redacted once and the answer kept
#: (``_short_text``): at most 4,096 of them, 1 to 3 MiB
KEPT_CHARS = 128
#: what no jsonb string holds: NUL (\u0000 is refused), a lone surrogate (no UTF-8)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

T = TypeVar("T")
#: query parameters that carry credentials under names a field would not
#: (``secret_name`` keeps a bare ``key``): a name whose last word ends in
#: "key" (``key``, ``hapikey``, ``subscription-key``), or one of these
_QUERY_SECRET_WORDS = frozenset({"sig", "auth", "jwt"})
_WORDS = re.compile(r"[^A-Za-z0-9]+")


def text(value: str) -> str:
    """A caller's string, its head redacted, then cut to ``MAX_CHARS``."""
    if len(value) <= KEPT_CHARS:
        return _short_text(value)
    return _text(value)


@functools.lru_cache(maxsize=4096)
def _short_text(value: str) -> str:
    """``_text`` of a short string, kept: the same senders, recipients,
    header names and subjects come back request after request, and
    redaction (a dozen patterns) is a pure function of the string."""
    return _text(value)


def _text(value: str) -> str:
    cleaned = _UNSTORABLE.sub("\ufffd", redact_head(value, REDACTED_CHARS))
    if len(cleaned) <= MAX_CHARS and len(value) <= REDACTED_CHARS:
        return cleaned
    return cleaned[:MAX_CHARS - 1] + "…"


def _bounded(out: dict[str, Any], name: str, items: Sequence[T],
             shown: Callable[[T], Any]) -> None:
    """The first ``MAX_ITEMS`` of ``items``, as ``shown``, under ``name``; how
    many more under ``<name>_omitted`` (those are never read)."""
    out[name] = [shown(item) for item in items[:MAX_ITEMS]]
    if len(items) > MAX_ITEMS:
        out[f"{name}_omitted"] = len(items) - MAX_ITEMS


def target(path: str, query: str) -> str:
    """The path and query as the operator reads them: each query parameter
    whose (decoded) name is secret-looking has its value blanked (``api%5Fkey``
    as ``api_key``), then the whole through ``leases.redact``."""
    if not query:
        return text(path)
    params = []
    for pair in query[:REDACTED_CHARS].split("&"):  # text() reads no further
        name, eq, _ = pair.partition("=")
        params.append(f"{name}={MASK}" if eq and _query_secret(unquote(name)) else pair)
    return text(f"{path}?{'&'.join(params)}")


def _query_secret(name: str) -> bool:
    """Whether a query parameter called ``name`` holds a credential."""
    if secret_name(name):
        return True
    words = [w.lower() for w in _WORDS.split(name) if w]
    return bool(words) and (words[-1].endswith("key") or words[-1] in _QUERY_SECRET_WORDS)


def email_summary(call: EmailCall) -> dict[str, Any]:
    email = call.email
    out: dict[str, Any] = {"kind": "email", "from": text(email.sender)}
    for name, addresses in (("to", email.to), ("cc", email.cc), ("bcc", email.bcc)):
        _bounded(out, name, addresses, text)
    if email.reply_to:
        out["reply_to"] = text(email.reply_to)
    out["subject"] = text(email.subject)
    _bounded(out, "headers", list(email.headers), text)
    _bounded(out, "attachments", email.attachments, lambda a: {
        "name": text(a.filename), "content_type": text(a.content_type),
        "bytes": len(a.content)})
    out["text_bytes"] = None if email.text is None else len(email.text.encode())
    out["html_bytes"] = None if email.html is None else len(email.html.encode())
    out["message_bytes"] = len(call.message) if call.message else None
    return out


def http_summary(call: HttpCall, content_type: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "http", "method": call.method,
                           "path": target(call.path, call.query)}
    _bounded(out, "headers", list(call.forwarded), text)
    out["body_bytes"] = len(call.body)
    out["content_type"] = text(content_type) if call.body and content_type else None
    return out
