"""Pure functions of idempotency: request fingerprints and the keys derived
for providers.

A fingerprint covers provider, method, path (with query) and body; a JSON body
is canonicalised first (sorted keys, no spaces), so neither key order nor
spacing makes two requests differ.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

MESSAGE_ID_DOMAIN = "fencegate"


class NestedTooDeep(ValueError):
    """A JSON body nested deeper than the parser (or the encoder) recurses."""


def canonical_body(body: bytes, content_type: str | None) -> bytes:
    """The body in canonical form: JSON re-encoded, anything else as sent
    (and JSON that cannot be re-encoded as UTF-8: ``"\\ud800"``)."""
    if body and (content_type or "").split(";")[0].strip().lower().endswith("json"):
        try:
            parsed = json.loads(body)
        except RecursionError:
            raise NestedTooDeep from None
        except (ValueError, UnicodeDecodeError):
            return body
        try:
            return canonical_json(parsed)
        except RecursionError:
            raise NestedTooDeep from None
        except UnicodeEncodeError:  # an escaped surrogate without its partner
            return body
    return body


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def fingerprint(provider: str, method: str, path: str, body: bytes) -> bytes:
    """sha256 over the parts, each length-prefixed so no two splits collide."""
    h = hashlib.sha256()
    for part in (provider.encode(), method.upper().encode(), path.encode(), body):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def derived_key(client: str, key: str) -> str:
    """The key sent to providers: the same for every attempt of one effect,
    different across clients that happen to choose the same key."""
    return hashlib.sha256(f"{client}\x00{key}".encode()).hexdigest()[:40]


def message_id(client: str, key: str) -> str:
    """The Message-ID of an email effect: derived from client and key."""
    return f"<{derived_key(client, key)}@{MESSAGE_ID_DOMAIN}>"
