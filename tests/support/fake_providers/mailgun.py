"""A fake Mailgun (https://documentation.mailgun.com/docs/mailgun/api-reference).

``POST /v3/{domain}/messages``, multipart/form-data, HTTP Basic as ``api``
with the API key (a wrong one: 403, "Auth error or access denied", as the
responses page puts it); a missing field 400 ``{"message"}``; success 200
``{"id": "<...@domain>", "message": "Queued. Thank you."}``. Mailgun documents
no idempotency key: every request sends.
"""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from .base import FakeProvider, Sent, json_answer


class FakeMailgun(FakeProvider):
    secret_env = "FENCEGATE_TEST_MAILGUN_KEY"
    secret = "key-test-123"
    domain = "mg.example.com"

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/v3/{domain}/messages", self.send)]

    async def send(self, request: web.Request) -> web.StreamResponse:
        expected = "Basic " + base64.b64encode(f"api:{self.secret}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.Response(status=403, text="Forbidden")
        if request.match_info["domain"] != self.domain:
            return json_answer({"message": "Domain not found"}, 404)
        if not request.content_type.startswith("multipart/form-data"):
            return json_answer({"message": "Unsupported content type"}, 400)
        form = await request.post()
        for required in ("from", "to", "subject"):
            if required not in form:
                return json_answer({"message": f"'{required}' parameter is missing"}, 400)
        if "text" not in form and "html" not in form:
            return json_answer({"message": "Need at least one of 'text' or 'html' "
                                "parameters specified"}, 400)
        headers = {k[2:]: str(v) for k, v in form.items() if k.startswith("h:")}
        attachments = []
        for item in form.getall("attachment", []):
            assert isinstance(item, web.FileField)
            attachments.append((item.filename, item.content_type, item.file.read()))
        mid = self.new_id(f"<20260101000000.{{n}}@{self.domain}>")
        sent = Sent(
            id=mid, sender=str(form["from"]), to=[str(v) for v in form.getall("to")],
            cc=[str(v) for v in form.getall("cc", [])],
            bcc=[str(v) for v in form.getall("bcc", [])],
            reply_to=headers.pop("Reply-To", None), subject=str(form["subject"]),
            text=str(form["text"]) if "text" in form else None,
            html=str(form["html"]) if "html" in form else None, headers=headers,
            attachments=attachments, request_headers=dict(request.headers))
        return await self.respond(
            sent, lambda: json_answer({"id": mid, "message": "Queued. Thank you."}))
