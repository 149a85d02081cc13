"""Amazon SES API v2: ``POST /v2/email/outbound-emails`` with a raw MIME
message (https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html).

The message is the one SMTP would send (``mime.build_message``: headers,
parts, attachments); ``Destination`` is the envelope, Bcc included. Every
request is signed with AWS Signature Version 4 by botocore (the
``fencegate[ses]`` extra), never by our own code. The answer carries
``MessageId``.
"""

from __future__ import annotations

import base64
from typing import Any

from ...config import HttpProviderConfig
from ..base import EmailCall
from ..mime import build_message
from .base import ApiRequest, EmailApi, bare, field_of, json_body

#: the name SES signs under (botocore's sesv2 model: ``signingName``)
SIGNING_NAME = "ses"


async def build(call: EmailCall, config: HttpProviderConfig) -> ApiRequest:
    req = call.email
    raw = build_message(call, config.idempotency_header)
    destination = {"ToAddresses": [bare(a) for a in req.to]}
    if req.cc:
        destination["CcAddresses"] = [bare(a) for a in req.cc]
    if req.bcc:
        destination["BccAddresses"] = [bare(a) for a in req.bcc]
    body: dict[str, Any] = {"FromEmailAddress": bare(req.sender), "Destination": destination,
                            "Content": {"Raw": {"Data": base64.b64encode(raw).decode()}}}
    return ApiRequest("v2/email/outbound-emails", json_body(body), "application/json")


def sign(config: HttpProviderConfig, method: str, url: str, headers: dict[str, str],
         body: bytes) -> dict[str, str]:
    """``headers`` with SigV4's ``Authorization``, ``X-Amz-Date`` (and
    ``X-Amz-Security-Token``) added, over exactly this method, URL, headers
    and body."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    assert config.aws is not None and config.region is not None, "the ses preset's settings"
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    credentials = Credentials(config.aws.access_key_id, config.aws.secret_access_key,
                              config.aws.session_token)
    SigV4Auth(credentials, SIGNING_NAME, config.region).add_auth(request)
    return dict(request.headers.items())


API = EmailApi(build=build, message_id=lambda headers, body: field_of(body, "MessageId"),
               sign=sign)
