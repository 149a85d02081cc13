"""A fake Resend (https://resend.com/docs/api-reference).

``POST /emails`` with ``Authorization: Bearer <key>``: a missing key is 401
``missing_api_key``, a wrong one 403 ``invalid_api_key``; a missing field 422
``missing_required_field`` (errors page). ``Idempotency-Key`` (1 to 256
characters, else 400 ``invalid_idempotency_key``) is remembered for 24 hours:
the same key and payload get the first answer and send nothing; another
payload 409 ``invalid_idempotent_request``; while the first is still being
processed 409 ``concurrent_idempotent_requests`` (idempotency-keys page).
Answers carry ``ratelimit-*`` headers; a 429 carries ``retry-after``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

from .base import FakeProvider, Sent, address_list, json_answer

PACE = {"ratelimit-limit": "2", "ratelimit-remaining": "1", "ratelimit-reset": "1"}


def error(status: int, name: str, message: str) -> web.Response:
    return json_answer({"statusCode": status, "name": name, "message": message}, status, PACE)


class FakeResend(FakeProvider):
    secret_env = "FENCEGATE_TEST_RESEND_KEY"
    secret = "re_test_123"

    def __init__(self) -> None:
        super().__init__()
        #: idempotency key → (payload, the answer's body, or None while in progress)
        self.keys: dict[str, tuple[bytes, dict[str, Any] | None]] = {}

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/emails", self.send)]

    async def send(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if not auth:
            return error(401, "missing_api_key", "Missing API key in the authorization header.")
        if auth != f"Bearer {self.secret}":
            return error(403, "invalid_api_key", "API key is invalid.")
        payload = await request.read()
        try:
            body = json.loads(payload)
        except ValueError:
            return error(422, "validation_error", "Invalid JSON")
        missing = [f for f in ("from", "to", "subject") if not body.get(f)]
        if missing or (body.get("text") is None and body.get("html") is None):
            return error(422, "missing_required_field",
                         f"Missing `{(missing or ['text'])[0]}` field.")
        key = request.headers.get("Idempotency-Key")
        if key is not None:
            if not 1 <= len(key) <= 256:
                return error(400, "invalid_idempotency_key",
                             "The key must be between 1-256 chars.")
            seen = self.keys.get(key)
            if seen is not None:
                if seen[0] != payload:
                    return error(409, "invalid_idempotent_request",
                                 "Same idempotency key used with a different request payload.")
                if seen[1] is None:
                    return error(409, "concurrent_idempotent_requests", "Same idempotency key "
                                 "used while original request is still in progress.")
                return json_answer(seen[1], 200, PACE)
        answer = {"id": self.new_id("4ef9a417-02e9-4d39-ad75-9611e0fcc{n:03d}")}
        if key is not None and not (self.script and not self.script[0].acted):
            self.keys[key] = (payload, None)
        sent = Sent(
            id=answer["id"], sender=body["from"], to=address_list(body["to"]),
            cc=address_list(body.get("cc")), bcc=address_list(body.get("bcc")),
            reply_to=body.get("reply_to"), subject=body["subject"], text=body.get("text"),
            html=body.get("html"), headers=dict(body.get("headers") or {}),
            attachments=[(a["filename"], a.get("content_type", ""),
                          base64.b64decode(a["content"])) for a in body.get("attachments", [])],
            request_headers=dict(request.headers), request_body=payload)
        try:
            return await self.respond(sent, lambda: json_answer(answer, 200, PACE))
        finally:
            if key is not None and key in self.keys:
                self.keys[key] = (payload, answer)
