"""A fake Amazon SES API v2 (https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html).

``POST /v2/email/outbound-emails`` signed with AWS Signature Version 4 for the
service ``ses``: the fake recomputes the signature over what arrived (with
botocore, from the headers the request says it signed) and answers 403
``SignatureDoesNotMatch`` when it differs, so a header changed after signing,
a body re-encoded in transit, or a wrong key or region is caught. Errors are
restJson1: the type in ``x-amzn-ErrorType``, ``{"message"}`` in the body.
Success: 200 ``{"MessageId"}``. SES documents no idempotency token.
"""

from __future__ import annotations

import base64
import datetime
import email
import email.policy
import json
import re
from typing import Any

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from .base import FakeProvider, Sent, json_answer

_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/"
                   r"(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request, "
                   r"SignedHeaders=(?P<signed>[^,]+), Signature=(?P<signature>[0-9a-f]{64})")


def error(status: int, kind: str, message: str) -> web.Response:
    return json_answer({"message": message}, status, {"x-amzn-ErrorType": kind})


class FakeSes(FakeProvider):
    secret_env = "FENCEGATE_TEST_AWS_SECRET"
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    key_id_env = "FENCEGATE_TEST_AWS_KEY_ID"
    key_id = "AKIAIOSFODNN7EXAMPLE"
    region = "eu-west-1"

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/v2/email/outbound-emails", self.send)]

    def _signature_problem(self, request: web.Request, body: bytes) -> str | None:
        m = _AUTH.fullmatch(request.headers.get("Authorization", ""))
        if m is None:
            return "missing or malformed SigV4 Authorization header"
        if (m["key"], m["region"], m["service"]) != (self.key_id, self.region, "ses"):
            return f"credential scope {m['key']}/{m['region']}/{m['service']}"
        stamp = request.headers.get("X-Amz-Date", "")
        when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
        if abs(datetime.datetime.now(datetime.UTC) - when) > datetime.timedelta(minutes=5):
            return "request time too skewed"
        signed = m["signed"].split(";")
        if "host" not in signed:
            return "host is not signed"
        headers = {name: request.headers[name] for name in signed if name in request.headers}
        aws = AWSRequest(method=request.method, url=f"http://{request.host}{request.path_qs}",
                         data=body, headers=headers)
        aws.context["timestamp"] = stamp
        signer = SigV4Auth(Credentials(self.key_id, self.secret), "ses", self.region)
        expected = signer.signature(
            signer.string_to_sign(aws, signer.canonical_request(aws)), aws)
        return None if expected == m["signature"] else "signature differs"

    async def send(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        problem = self._signature_problem(request, body)
        if problem is not None:
            return error(403, "SignatureDoesNotMatch", "The request signature we calculated "
                         f"does not match the signature you provided ({problem}).")
        try:
            payload = json.loads(body)
            raw = base64.b64decode(payload["Content"]["Raw"]["Data"], validate=True)
        except (ValueError, KeyError, TypeError):
            return error(400, "BadRequestException", "The input you provided is invalid.")
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        destination = payload.get("Destination", {})
        text = msg.get_body(("plain",))
        html = msg.get_body(("html",))
        mid = self.new_id("010201940000aaaa-{n:08d}-0000-0000-0000-000000000000-000000")
        sent = Sent(
            id=mid, sender=str(msg["From"]), to=destination.get("ToAddresses", []),
            cc=destination.get("CcAddresses", []), bcc=destination.get("BccAddresses", []),
            reply_to=str(msg["Reply-To"]) if msg["Reply-To"] else None,
            subject=str(msg["Subject"]),
            text=text.get_content() if text is not None else None,  # type: ignore[attr-defined]
            html=html.get_content() if html is not None else None,  # type: ignore[attr-defined]
            headers={k: str(v) for k, v in msg.items()},
            attachments=[(a.get_filename() or "", a.get_content_type(),
                          a.get_payload(decode=True)) for a in msg.iter_attachments()],
            request_headers=dict(request.headers))
        return await self.respond(sent, lambda: json_answer({"MessageId": mid}))
