"""A fake Twilio SendGrid (https://www.twilio.com/docs/sendgrid/api-reference/mail-send/mail-send).

``POST /v3/mail/send`` with ``Authorization: Bearer <key>`` (else 401);
a malformed body 400 with ``{"errors": [{"message", "field"}]}``; success
``202 Accepted`` with no body and the id in ``X-Message-Id``. Answers carry
``X-RateLimit-*``. SendGrid documents no idempotency key: every request sends.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

from .base import FakeProvider, Sent, json_answer

PACE = {"X-RateLimit-Limit": "600", "X-RateLimit-Remaining": "599",
        "X-RateLimit-Reset": "1767225600"}


def errors(status: int, message: str, field: str | None = None) -> web.Response:
    return json_answer({"errors": [{"message": message, "field": field, "help": None}]},
                       status, PACE)


def _address(value: dict[str, str]) -> str:
    return f"{value['name']} <{value['email']}>" if value.get("name") else value["email"]


class FakeSendGrid(FakeProvider):
    secret_env = "FENCEGATE_TEST_SENDGRID_KEY"
    secret = "SG.test-key"

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/v3/mail/send", self.send)]

    async def send(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.secret}":
            return errors(401, "The provided authorization grant is invalid, expired, or "
                          "revoked")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return errors(400, "Bad Request")
        envelopes = body.get("personalizations") or []
        if not envelopes or not envelopes[0].get("to"):
            return errors(400, "The to parameter is required for all personalization objects, "
                          "and must have at least one email", "personalizations.0.to")
        content = body.get("content") or []
        if not content or (len(content) > 1 and content[0]["type"] != "text/plain"):
            return errors(400, "If present, text/plain content must be first, followed by "
                          "text/html", "content")
        parts = {c["type"]: c["value"] for c in content}
        envelope = envelopes[0]
        mid = self.new_id("14c5d75ce93.dfd.64b469.filter-{n:03d}")
        sent = Sent(
            id=mid, sender=_address(body["from"]),
            to=[_address(a) for a in envelope["to"]],
            cc=[_address(a) for a in envelope.get("cc", [])],
            bcc=[_address(a) for a in envelope.get("bcc", [])],
            reply_to=_address(body["reply_to"]) if body.get("reply_to") else None,
            subject=body.get("subject", ""), text=parts.get("text/plain"),
            html=parts.get("text/html"), headers=dict(body.get("headers") or {}),
            attachments=[(a["filename"], a.get("type", ""), base64.b64decode(a["content"]))
                         for a in body.get("attachments", [])],
            request_headers=dict(request.headers))
        return await self.respond(
            sent, lambda: web.Response(status=202, headers={**PACE, "X-Message-Id": mid}))
