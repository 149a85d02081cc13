"""Pure checks of what a caller sends: the effect headers, a JSON body, the
headers and path of a forwarded request. The body of an email is checked in
``email_body.py``.

Every failure is a ``Problem("bad_request")`` whose detail names the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, unquote_to_bytes

from gateway.api.problems import Problem
from gateway.wire import FENCE_RESOURCE, FENCE_TOKEN, IDEMPOTENCY_KEY
from leases import policy

MAX_FENCE = 2**63 - 1
_KEY = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,254}")
_DECIMAL = re.compile(r"[0-9]{1,19}")


def bad(field: str, why: str) -> Problem:
    return Problem("bad_request", f"{field}: {why}", field=field)


def no_crlf(field: str, value: str) -> str:
    if "\r" in value or "\n" in value or "\x00" in value:
        raise bad(field, "must not contain CR, LF or NUL")
    return value


#: a JSON escape of a UTF-16 surrogate (paired or not)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def json_value(raw: bytes) -> Any:
    """A request body parsed as JSON: the one place the gateway parses what a
    caller sends it. Nesting deeper than the parser recurses raises
    RecursionError, which is not a ValueError: it is a 400 like the rest. So
    is a string holding an escaped surrogate without its partner
    (``"\\ud800"``): it parses, as text no UTF-8 encoder (the database's, a
    provider's) takes. The bytes are decoded here, strictly: ``json.loads`` on
    bytes guesses UTF-16 or UTF-32 and decodes with "surrogatepass", so a
    surrogate written out as UTF-8 bytes (CESU-8, ``ED A0 80``) parsed as
    one, with no escape for the check below to find."""
    try:
        value = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise bad("body", "must be UTF-8") from None
    except RecursionError:
        raise bad("body", "is nested too deeply") from None
    except ValueError:
        raise bad("body", "must be valid JSON") from None
    if _SURROGATE_ESCAPE.search(raw):  # rare: only then is the whole body re-encoded
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise bad("body", "must not hold a \\ud800-\\udfff escape without its "
                      "partner (not Unicode text)") from None
        except RecursionError:
            raise bad("body", "is nested too deeply") from None
    return value


def is_key(value: str) -> bool:
    """Whether ``value`` could be an ``Idempotency-Key``: 1 to 255 printable ASCII."""
    return _KEY.fullmatch(value) is not None


@dataclass(frozen=True)
class EffectHeaders:
    """The three headers of an effect request: the resource, its fence, and
    the caller's name for the effect."""

    resource: str
    fence: int
    key: str


def effect_headers(headers: Any) -> EffectHeaders:
    """Read and check ``Fence-Resource``, ``Fence-Token`` and ``Idempotency-Key``."""
    values = {}
    for name in (FENCE_RESOURCE, FENCE_TOKEN, IDEMPOTENCY_KEY):
        found = headers.getall(name, [])
        if not found:
            raise bad(name, "header is required")
        if len(found) > 1:
            raise bad(name, "header must appear once")
        values[name] = no_crlf(name, found[0])
    resource = values[FENCE_RESOURCE]
    if not policy.RESOURCE_PATTERN.fullmatch(resource):
        raise bad(FENCE_RESOURCE, "must be 1 to 200 of A-Z a-z 0-9 . _ : / @ -")
    token = values[FENCE_TOKEN]
    if not _DECIMAL.fullmatch(token) or not 0 < int(token) <= MAX_FENCE:
        raise bad(FENCE_TOKEN, "must be a positive 64-bit decimal integer")
    key = values[IDEMPOTENCY_KEY]
    if not _KEY.fullmatch(key):
        raise bad(IDEMPOTENCY_KEY, "must be 1 to 255 printable ASCII characters")
    return EffectHeaders(resource, int(token), key)


#: the longest header line the gateway's server reads (aiohttp's
#: ``max_field_size``): what a provider behind the same defaults is sure to take
MAX_FIELD_BYTES = 8190


def joined_fields_fit(headers: dict[str, str]) -> dict[str, str]:
    """Headers to forward, each within ``MAX_FIELD_BYTES`` once a repeated
    field's lines are joined into one (``providers.base.caller_headers``):
    two lines of 5,000 bytes passed the gateway's server and made one field
    the provider's refused (a 400 recorded as the effect's answer, the key
    spent), where it is a 400 before the admission."""
    for name, value in headers.items():
        # the whole line, "name: value": what aiohttp's pure-Python parser
        # counts (its C parser counts the value alone, a little more lenient)
        if len(name.encode()) + 2 + len(value.encode()) > MAX_FIELD_BYTES:
            raise bad(f"header {name[:64]}", f"must be at most {MAX_FIELD_BYTES} bytes "
                      "with its name, its lines joined as the provider is sent them")
    return headers


def utf8_headers(headers: dict[str, str]) -> dict[str, str]:
    """Headers to forward as the caller sent them: each value UTF-8. aiohttp
    reads bytes that are not as lone surrogates, which its client's C writer
    drops (the provider would read "10\\xff00" as "1000") and its
    pure-Python writer cannot encode (after the admission)."""
    for name, value in headers.items():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise bad(f"header {name[:64]}", "must be UTF-8 to be forwarded as sent") from None
    return headers


def provider_path(path: str) -> str:
    """The path after ``/v1/http/{provider}/``, refused if it could leave the
    provider's base URL, or if it is not plain: every character, and every
    byte a percent-escape stands for, printable ASCII. Overlong UTF-8 dots
    (``%c0%ae``), full-width or other Unicode dots, raw or encoded, pass the
    checks below undecoded and mean ".." to a server that decodes them."""
    if not path.isascii() or any(b < 0x20 or b > 0x7E for b in unquote_to_bytes(path)):
        raise bad("path", "must be plain: printable ASCII, and percent-escapes only of "
                  "printable ASCII bytes")
    decoded = unquote(path)
    no_crlf("path", decoded)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in decoded):
        raise bad("path", "must not contain control characters")
    if "\\" in decoded or "://" in decoded or decoded.startswith("/"):
        raise bad("path", "must be a relative path under the provider's base URL")
    if ";" in decoded:  # path parameters: "..;/" climbs out on some servers
        raise bad("path", "must not contain ;")
    # ".", "..", "...", ".. ": servers and proxies trim dots and spaces differently
    if any(seg and not seg.strip(". ") for seg in decoded.split("/")):
        raise bad("path", "must not contain segments made only of dots or spaces")
    if "%" in decoded and unquote(decoded) != decoded:
        raise bad("path", "must not be encoded twice")
    return path
