"""``Problem``: an answer to the caller, as an RFC 9457 document (the error
tree is drawn in errors.py).

Every problem ``code`` the gateway can answer is listed in ``wire.PROBLEMS``
with its status; nothing else builds a problem response.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.errors import GatewayError
from gateway.wire import PROBLEM_HEADER, PROBLEMS, ProblemCode

PROBLEM_TYPE_BASE = "https://fencegate.dev/problems/"


#: the members every problem document has; the rest are a problem's own facts
PROBLEM_MEMBERS = frozenset({"type", "title", "status", "detail", "code"})


class Problem(GatewayError):
    """An error answer. ``extra`` members go into the document; ``headers`` onto
    the response."""

    def __init__(self, code: ProblemCode, detail: str, *,
                 headers: dict[str, str] | None = None,
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
