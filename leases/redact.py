"""One way to blank secrets in what a caller wrote, before fencegate stores or
shows it: job errors (``last_error``, leases/retry.py), and job payloads and
effect summaries on the operators' console.

- In a structure (decoded JSON), a value under a secret-looking name
  (``api_key``, ``token``, ``password``, ``Authorization``, ...; at any depth)
  becomes ``MASK``; every other value is kept, its strings blanked as text.
- In text: credentials in URLs, ``Bearer``/``Basic`` credentials,
  ``name=value`` and ``"name": "value"`` pairs with a secret-looking name, and
  provider-style keys (``sk_live_...``). The text around a secret is kept.

Pure: the input is not changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import pairwise
from typing import Any

MASK = "***"

#: words that make a field name secret-looking (one word of the name, split at
#: ``_``, ``-``, ``.``, spaces and camelCase humps)
SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "passphrase", "secret", "token", "authorization",
    "credential", "credentials", "cookie", "apikey", "signature"})
#: pairs of words that do (``api_key``, ``private-key``, ``accessKey``, ...)
SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"),
                          ("secret", "key"), ("session", "key"), ("auth", "key")})
_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")

_NAME = (r"password|passwd|pwd|passphrase|secret|[a-z_]*token|api[_-]?key|authorization|"
         r"private[_-]?key|access[_-]?key|credentials?|cookie")
#: credentials in URLs and DSNs
_URL_CREDENTIALS = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")
#: a run of text a URL's credentials can lie in (no space, and an "@" only
#: at its end), tried from its first character only: the credentials pattern
#: alone rescans to the end from every "://x:" that no "@" closes, which is
#: quadratic in text made of them (8 KB of query: 56 ms; a megabyte: minutes)
_CREDENTIAL_RUN = re.compile(r"(?<![^@\s])[^@\s]+@")
#: the start of a quoted value under a secret name (its quote, group 1)
_OPENED_QUOTE = re.compile(rf"(?i)\b(?:{_NAME})[\"']?\s*[=:]\s*([\"'])")
#: the start of a URL's credentials, open if its run reaches a cut (redact_head)
_OPENED_CREDENTIALS = re.compile(r"://[^:/@\s]+:")
_RUN_TO_THE_END = re.compile(r"[^@\s]*")


def _url_credentials(m: re.Match[str]) -> str:
    return _URL_CREDENTIALS.sub(r"\1***@", m.group(0))


#: a value ends at a space, a separator or a closing bracket or quote
_SECRETS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (_CREDENTIAL_RUN, _url_credentials),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 ***"),
    (re.compile(rf"(?i)\b({_NAME})([\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&)\]}}\"']+)"),
     lambda m: m.group(1) + m.group(2) + (
         m.group(3)[0] + MASK + m.group(3)[0] if m.group(3)[0] in "\"'" else MASK)),
    (re.compile(r"\b(sk|pk|rk|whsec|fg_dev)_[A-Za-z0-9_-]{4,}"),
     lambda m: m.group(0) if m.group(0).endswith(MASK) else f"{m.group(1)}_{MASK}"),
]


def secret_name(name: str) -> bool:
    """Whether a field called ``name`` holds a secret, by its words."""
    words = [w.lower() for w in _SPLIT.split(_HUMP.sub("_", name)) if w]
    return (any(w in SECRET_WORDS for w in words)
            or any(pair in SECRET_PAIRS for pair in pairwise(words)))


def redact(value: Any) -> Any:
    """``value`` with its secrets blanked: a string as text, a dict or list
    (decoded JSON) field by field at any depth; anything else as it is."""
    if isinstance(value, str):
        for pattern, replacement in _SECRETS:
            value = pattern.sub(replacement, value)
        return _blank_open_quote(value)
    if isinstance(value, dict):
        return {k: (MASK if value_ is not None else None) if secret_name(str(k))
                else redact(value_) for k, value_ in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def _blank_open_quote(text: str) -> str:
    """``text`` blanked to the end from a quoted secret value whose quote
    never closes (a message cut short): the patterns above keep it whole."""
    if "'" not in text and '"' not in text:
        return text
    for m in _OPENED_QUOTE.finditer(text):
        if text.find(m.group(1), m.end()) == -1:
            return text[:m.end()] + MASK
    return text


def redact_head(value: str, chars: int) -> str:
    """The first ``chars`` characters of ``value``, redacted: the work is
    bounded by ``chars``, whatever the length of ``value``. A secret the cut
    leaves open, whose end (a URL password's "@", a quoted value's closing
    quote) lies past the head, is blanked from its start to the end."""
    if len(value) <= chars:
        return str(redact(value))
    head: str = redact(value[:chars])  # an open quote is blanked by redact itself
    for m in _OPENED_CREDENTIALS.finditer(head):
        if _RUN_TO_THE_END.fullmatch(head, m.end()):
            return head[:m.end()] + MASK
    return head
