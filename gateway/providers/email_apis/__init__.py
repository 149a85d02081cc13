"""``POST /v1/email`` over HTTP email APIs: one module per API, one shape.

Each module maps the gateway's email (``requests.EmailRequest``) onto its
provider's documented request and finds the provider's message id in the
answer. What every API request carries besides (authentication, the
idempotency header, ``Fence-Resource``/``Fence-Token``, a Standard Webhooks
signature) is added by ``providers/http.py``, which sends it through the same
gated connections as ``/v1/http``; ``providers/http_email.py`` judges the answer.
"""

from __future__ import annotations

from gateway.config.presets import EmailApiName
from gateway.providers.email_apis import mailgun, postmark, resend, sendgrid, ses
from gateway.providers.email_apis.base import ApiRequest, EmailApi

#: every email API, by the name a preset's ``email_api`` gives
EMAIL_APIS: dict[EmailApiName, EmailApi] = {
    "resend": resend.API,
    "postmark": postmark.API,
    "sendgrid": sendgrid.API,
    "mailgun": mailgun.API,
    "ses": ses.API,
}

__all__ = ["EMAIL_APIS", "ApiRequest", "EmailApi"]
