"""A fake Postmark (https://postmarkapp.com/developer/api/overview).

``POST /email`` with ``X-Postmark-Server-Token``: a missing or wrong token is
401; a malformed message 422 with ``{"ErrorCode", "Message"}``; success 200
``{"To", "SubmittedAt", "MessageID", "ErrorCode": 0, "Message": "OK"}``.
Postmark documents no idempotency key: every request sends.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

from .base import FakeProvider, Sent, address_list, json_answer


class FakePostmark(FakeProvider):
    secret_env = "FENCEGATE_TEST_POSTMARK_TOKEN"
    secret = "pm-server-token-123"

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/email", self.send)]

    async def send(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("X-Postmark-Server-Token") != self.secret:
            return json_answer({"ErrorCode": 10, "Message": "Request does not contain a valid "
                                "Server token."}, 401)
        if "application/json" not in request.headers.get("Accept", ""):
            return json_answer({"ErrorCode": 0, "Message": "Accept: application/json"}, 406)
        try:
            body = json.loads(await request.read())
        except ValueError:
            return json_answer({"ErrorCode": 402, "Message": "Received invalid JSON input."},
                               422)
        if not body.get("From") or not body.get("To"):
            return json_answer({"ErrorCode": 300, "Message": "Invalid email request"}, 422)
        if body.get("TextBody") is None and body.get("HtmlBody") is None:
            return json_answer({"ErrorCode": 300, "Message": "Provide either email TextBody "
                                "or HtmlBody or both."}, 422)
        mid = self.new_id("b7bc2f4a-e38e-4336-af7d-e6c392c2f{n:03d}")
        sent = Sent(
            id=mid, sender=body["From"], to=address_list(body["To"]),
            cc=address_list(body.get("Cc")), bcc=address_list(body.get("Bcc")),
            reply_to=body.get("ReplyTo"), subject=body.get("Subject", ""),
            text=body.get("TextBody"), html=body.get("HtmlBody"),
            headers={h["Name"]: h["Value"] for h in body.get("Headers", [])},
            attachments=[(a["Name"], a.get("ContentType", ""), base64.b64decode(a["Content"]))
                         for a in body.get("Attachments", [])],
            request_headers=dict(request.headers))
        answer = {"To": body["To"], "SubmittedAt": "2026-01-01T00:00:00.0000000-05:00",
                  "MessageID": mid, "ErrorCode": 0, "Message": "OK"}
        return await self.respond(sent, lambda: json_answer(answer))
