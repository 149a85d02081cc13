"""Resend: ``POST /emails``, JSON (https://resend.com/docs/api-reference/emails/send-email).

The answer is ``{"id": "..."}``. Resend dedupes on ``Idempotency-Key`` for 24
hours and answers a repeat with the first answer (the preset sets the header).
"""

from __future__ import annotations

from typing import Any

from gateway.config import HttpProviderConfig
from gateway.providers.base import EmailCall
from gateway.providers.email_apis.base import ApiRequest, EmailApi, field_of, json_body
from gateway.providers.mime import email_headers


async def build(call: EmailCall, config: HttpProviderConfig) -> ApiRequest:
    req = call.email
    body: dict[str, Any] = {"from": req.sender, "to": req.to, "subject": req.subject,
                            "headers": email_headers(call)}
    optional: dict[str, Any] = {"cc": req.cc, "bcc": req.bcc, "reply_to": req.reply_to,
                                "text": req.text, "html": req.html}
    body.update({k: v for k, v in optional.items() if v})
    if req.text == "":
        body["text"] = ""  # "" asks Resend not to derive a text part from the HTML
    if req.attachments:
        body["attachments"] = [{"filename": a.filename, "content": a.base64,
                                "content_type": a.content_type} for a in req.attachments]
    return ApiRequest("emails", json_body(body), "application/json")


API = EmailApi(build=build, message_id=lambda headers, body: field_of(body, "id"))
