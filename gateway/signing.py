"""The signatures on what the gateway sends to an HTTP provider, made by the
gateway (providers/http.py) and checked by receivers (gateway/receiver/).

- ``webhook-signature``: Standard Webhooks, HMAC-SHA256 over
  ``{webhook-id}.{webhook-timestamp}.{body}``. Any Standard Webhooks library
  checks it. It does not cover ``Fence-Resource`` or ``Fence-Token``.
- ``Fence-Signature``: HMAC-SHA256, same key, over
  ``fencegate-fence\\n{webhook-id}\\n{webhook-timestamp}\\n{Fence-Resource}\\n{Fence-Token}\\n{body}``.
  It covers the fence headers too, so a receiver can trust the fence it
  keeps. No header value holds a line break, so the fields cannot be shifted
  into each other; the prefix keeps either signature from passing for the
  other.

Both are ``v1,<base64>``, several space-separated in one header (a receiver
accepts any that matches: a secret is rotated by signing with both for a
while). Nothing here imports the gateway's server.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable
from typing import Final

WEBHOOK_ID: Final = "webhook-id"
WEBHOOK_TIMESTAMP: Final = "webhook-timestamp"
WEBHOOK_SIGNATURE: Final = "webhook-signature"
FENCE_SIGNATURE: Final = "Fence-Signature"
#: the only scheme either header carries (Standard Webhooks' HMAC-SHA256)
VERSION: Final = "v1"
_FENCE_DOMAIN: Final = b"fencegate-fence\n"


def signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: base64, ``whsec_`` and the
    padding optional (what the reference library accepts). ValueError if it is
    not base64."""
    encoded = secret.removeprefix("whsec_")
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)


def webhook_content(msg_id: str, timestamp: str | int, body: bytes) -> bytes:
    """What ``webhook-signature`` signs."""
    return f"{msg_id}.{timestamp}.".encode() + body


def fence_content(msg_id: str, timestamp: str | int, resource: str, fence: str | int,
                  body: bytes) -> bytes:
    """What ``Fence-Signature`` signs."""
    return _FENCE_DOMAIN + f"{msg_id}\n{timestamp}\n{resource}\n{fence}\n".encode() + body


def sign(key: bytes, content: bytes) -> str:
    """One ``v1,<base64 HMAC-SHA256>`` signature."""
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return f"{VERSION}," + base64.b64encode(digest).decode()


def webhook_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """A Standard Webhooks ``webhook-signature`` value (``v1,<base64 hmac>``)."""
    return sign(signing_key(secret), webhook_content(msg_id, timestamp, body))


def fence_signature(secret: str, msg_id: str, timestamp: int, resource: str, fence: int,
                    body: bytes) -> str:
    """A ``Fence-Signature`` value (``v1,<base64 hmac>``)."""
    return sign(signing_key(secret), fence_content(msg_id, timestamp, resource, fence, body))


def matches(header: str, keys: Iterable[bytes], content: bytes) -> bool:
    """Whether any ``v1,`` signature in ``header`` (space-separated; other
    versions ignored) is the HMAC of ``content`` under any of ``keys``.
    Every comparison is constant-time."""
    candidates = [sig.encode() for version, _, sig in
                  (part.partition(",") for part in header.split())
                  if version == VERSION and sig]
    found = False
    for key in keys:
        expected = sign(key, content).partition(",")[2].encode()
        for candidate in candidates:
            found |= hmac.compare_digest(expected, candidate)
    return found
