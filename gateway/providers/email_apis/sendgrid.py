"""Twilio SendGrid: ``POST /v3/mail/send``, JSON with one personalization
(https://www.twilio.com/docs/sendgrid/api-reference/mail-send/mail-send).

Addresses are ``{"email", "name"?}``; the text part comes before the HTML one,
as SendGrid requires. The answer is ``202`` with an empty body and the id in
the ``X-Message-Id`` header.
"""

from __future__ import annotations

from typing import Any

from gateway.api.email_body import mailbox
from gateway.config import HttpProviderConfig
from gateway.providers.base import EmailCall
from gateway.providers.email_apis.base import ApiRequest, EmailApi, json_body
from gateway.providers.mime import email_headers


def _address(value: str) -> dict[str, str]:
    name, addr = mailbox(value)
    return {"email": addr, "name": name} if name else {"email": addr}


async def build(call: EmailCall, config: HttpProviderConfig) -> ApiRequest:
    req = call.email
    envelope: dict[str, Any] = {"to": [_address(a) for a in req.to]}
    if req.cc:
        envelope["cc"] = [_address(a) for a in req.cc]
    if req.bcc:
        envelope["bcc"] = [_address(a) for a in req.bcc]
    content = [{"type": t, "value": v} for t, v in (("text/plain", req.text),
                                                    ("text/html", req.html)) if v is not None]
    body: dict[str, Any] = {"personalizations": [envelope], "from": _address(req.sender),
                            "subject": req.subject, "content": content,
                            "headers": email_headers(call)}
    if req.reply_to:
        body["reply_to"] = _address(req.reply_to)
    if req.attachments:
        body["attachments"] = [{"content": a.base64, "filename": a.filename,
                                "type": a.content_type, "disposition": "attachment"}
                               for a in req.attachments]
    return ApiRequest("v3/mail/send", json_body(body), "application/json")


API = EmailApi(build=build, message_id=lambda headers, body: headers.get("X-Message-Id"))
