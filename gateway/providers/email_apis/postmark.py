"""Postmark: ``POST /email``, JSON with capitalised fields
(https://postmarkapp.com/developer/user-guide/send-email-with-api).

Recipients are comma-separated strings; headers a list of ``{Name, Value}``.
The answer carries ``MessageID``.
"""

from __future__ import annotations

from typing import Any

from gateway.config import HttpProviderConfig
from gateway.providers.base import EmailCall
from gateway.providers.email_apis.base import ApiRequest, EmailApi, field_of, json_body
from gateway.providers.mime import email_headers


async def build(call: EmailCall, config: HttpProviderConfig) -> ApiRequest:
    req = call.email
    body: dict[str, Any] = {
        "From": req.sender, "To": ", ".join(req.to), "Subject": req.subject,
        "Headers": [{"Name": k, "Value": v} for k, v in email_headers(call).items()],
    }
    optional: dict[str, Any] = {"Cc": ", ".join(req.cc), "Bcc": ", ".join(req.bcc),
                                "ReplyTo": req.reply_to, "TextBody": req.text,
                                "HtmlBody": req.html}
    body.update({k: v for k, v in optional.items() if v})
    if req.attachments:
        body["Attachments"] = [{"Name": a.filename, "Content": a.base64,
                                "ContentType": a.content_type} for a in req.attachments]
    return ApiRequest("email", json_body(body), "application/json",
                      headers={"Accept": "application/json"})


API = EmailApi(build=build, message_id=lambda headers, body: field_of(body, "MessageID"))
