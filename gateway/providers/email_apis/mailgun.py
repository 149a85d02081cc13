"""Mailgun: ``POST /v3/{domain}/messages``, multipart/form-data
(https://documentation.mailgun.com/docs/mailgun/api-reference/openapi-final/tag/Messages/).

One form field per recipient; headers as ``h:<Name>`` fields; attachments as
``attachment`` files. The answer is ``{"id": "<...>", "message": "Queued..."}``.
"""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import MultipartWriter

from gateway.config import HttpProviderConfig
from gateway.providers.base import EmailCall
from gateway.providers.email_apis.base import ApiRequest, EmailApi, field_of
from gateway.providers.mime import email_headers


async def build(call: EmailCall, config: HttpProviderConfig) -> ApiRequest:
    req = call.email
    form = MultipartWriter("form-data")

    def add(name: str, value: str) -> None:
        form.append(value).set_content_disposition("form-data", name=name)

    add("from", req.sender)
    for name, addresses in (("to", req.to), ("cc", req.cc), ("bcc", req.bcc)):
        for address in addresses:
            add(name, address)
    add("subject", req.subject)
    if req.text is not None:
        add("text", req.text)
    if req.html is not None:
        add("html", req.html)
    if req.reply_to:
        add("h:Reply-To", req.reply_to)
    for header, value in email_headers(call).items():
        add(f"h:{header}", value)
    for a in req.attachments:
        form.append(a.content, {"Content-Type": a.content_type}).set_content_disposition(
            "form-data", name="attachment", filename=a.filename)
    body = await form.as_bytes()
    assert config.domain is not None, "the mailgun preset requires a domain"
    return ApiRequest(f"v3/{quote(config.domain, safe='')}/messages", body, form.content_type)


API = EmailApi(build=build, message_id=lambda headers, body: field_of(body, "id"))
