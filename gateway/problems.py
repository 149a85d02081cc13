"""Errors of the gateway, and the one place each maps to an HTTP problem.

    GatewayError
    └── Problem                   an answer to the caller, as an RFC 9457 document
                                  (code → status and title in PROBLEMS below)

Every problem ``code`` the gateway can answer is listed in ``PROBLEMS``; nothing
else builds a problem response.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

PROBLEM_TYPE_BASE = "https://fencegate.dev/problems/"
PROBLEM_HEADER = "Fencegate-Problem"

#: code → (HTTP status, title)
PROBLEMS: dict[str, tuple[int, str]] = {
    "bad_request": (400, "Bad request"),
    "unauthenticated": (401, "Unauthenticated"),
    "forbidden_resource": (403, "Resource not allowed for this client"),
    "not_found": (404, "Not found"),
    "method_not_allowed": (405, "Method not allowed"),
    "request_timeout": (408, "Request body too slow"),
    "lease_held": (409, "Lease held by another owner"),
    "lease_lost": (409, "Lease lost"),
    "effect_in_progress": (409, "Effect in progress"),
    "effect_outcome_unknown": (409, "Effect outcome unknown"),
    "effect_not_unknown": (409, "Effect is not awaiting resolution"),
    "stale_fence": (412, "Stale fence"),
    "lease_expired": (412, "Lease expired"),
    "no_lease": (412, "No lease"),
    "invalid_fence": (412, "Invalid fence"),
    "payload_too_large": (413, "Payload too large"),
    "idempotency_key_reused": (422, "Idempotency key reused"),
    "provider_rejected": (422, "Provider rejected the effect"),
    "rate_limited": (429, "Rate limited"),
    "internal_error": (500, "Internal error"),
    "provider_error": (502, "Provider error"),
    "unavailable": (503, "Unavailable"),
    "overloaded": (503, "Overloaded"),
    "provider_timeout": (504, "Provider timeout"),
}


class GatewayError(Exception):
    """Base of every error raised by ``gateway``."""


class Problem(GatewayError):
    """An error answer. ``extra`` members go into the document; ``headers`` onto
    the response."""

    def __init__(self, code: str, detail: str, *, headers: dict[str, str] | None = None,
                 **extra: object) -> None:
        if code not in PROBLEMS:
            raise ValueError(f"unknown problem code {code!r}")
        super().__init__(detail)
        self.code = code
        self.status, self.title = PROBLEMS[code]
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra

    def document(self) -> dict[str, Any]:
        return {
            "type": PROBLEM_TYPE_BASE + self.code.replace("_", "-"),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            **self.extra,
        }

    def body(self) -> bytes:
        return json.dumps(self.document()).encode()

    def response_headers(self) -> dict[str, str]:
        """Content type, and ``Fencegate-Problem`` so clients can tell the gateway's
        own problems from a provider's answer passed through."""
        return {"Content-Type": "application/problem+json", PROBLEM_HEADER: self.code,
                **self.headers}

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=self.body(),
                            headers=self.response_headers())
