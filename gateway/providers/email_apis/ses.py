"""Amazon SES API v2: ``POST /v2/email/outbound-emails`` with a raw MIME
message (https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html).

The message is the one SMTP would send (``mime.build_message``: headers,
parts, attachments); ``Destination`` is the envelope, Bcc included. The
request is signed like every request to the ``ses`` preset (providers/sigv4.py).
The answer carries ``MessageId``.
"""

from __future__ import annotations

import base64
from typing import Any

from gateway.config import HttpProviderConfig
from gateway.providers.base import EmailCall
from gateway.providers.email_apis.base import ApiRequest, EmailApi, bare, field_of, json_body
from gateway.providers.mime import build_message


async def build(call: EmailCall, config: HttpProviderConfig) -> ApiRequest:
    req = call.email
    raw = call.message or build_message(call, config.idempotency_header)
    destination = {"ToAddresses": [bare(a) for a in req.to]}
    if req.cc:
        destination["CcAddresses"] = [bare(a) for a in req.cc]
    if req.bcc:
        destination["BccAddresses"] = [bare(a) for a in req.bcc]
    body: dict[str, Any] = {"FromEmailAddress": bare(req.sender), "Destination": destination,
                            "Content": {"Raw": {"Data": base64.b64encode(raw).decode()}}}
    return ApiRequest("v2/email/outbound-emails", json_body(body), "application/json")


API = EmailApi(build=build, message_id=lambda headers, body: field_of(body, "MessageId"))
