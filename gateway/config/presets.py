"""Provider presets: what each provider's own documentation says, as data.

``preset = "NAME"`` on a provider fills in its base URL (or SMTP host), how
it authenticates (the secret comes from an environment variable), the header
it dedupes on and for how long, which of its statuses mean "certainly not
acted" and which leave the outcome unknown, and the headers it paces callers
with. docs/providers.md gives each fact with the page that documents it; a
fact we could not confirm is left at the safe default (no idempotency, the
standard statuses) and said so there.

Everything here is plain data: ``gateway.config`` applies a preset while it
reads the file, the providers read the result from the provider's config, and
the effect path can read ``Preset.idempotency``, ``Preset.not_acted_statuses``
and ``Preset.pace`` to decide a resend or a wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

#: HTTP statuses that mean the provider certainly did not act, for every HTTP
#: provider: the key is freed (docs/gateway.md, "Answers")
DEFAULT_NOT_ACTED_STATUSES: frozenset[int] = frozenset({408, 425, 429, 503})
#: statuses that may come after the provider acted: the outcome is unknown
DEFAULT_UNKNOWN_STATUSES: frozenset[int] = frozenset({500, 502, 504})

#: which API ``POST /v1/email`` is mapped to, for HTTP email presets
EmailApiName = Literal["resend", "postmark", "sendgrid", "mailgun", "ses"]


@dataclass(frozen=True)
class Auth:
    """How a provider authenticates. The secret always comes from the
    environment: ``env`` names the variables read when the file names none.

    - ``bearer``: ``Authorization: Bearer <secret>``
    - ``header``: ``<header>: <secret>`` (Postmark's server token)
    - ``basic``: ``Authorization: Basic base64(<username>:<secret>)`` (Mailgun)
    - ``sigv4``: AWS Signature Version 4 over every request, for ``service``
      (``env``: key id, secret key, session token, the last optional)
    - ``smtp``: SMTP AUTH as ``username`` with the secret as password
    """

    scheme: Literal["bearer", "header", "basic", "sigv4", "smtp"]
    env: tuple[str, ...]
    header: str = "Authorization"
    username: str = ""
    service: str = ""  #: sigv4: the name requests are signed for


@dataclass(frozen=True)
class Idempotency:
    """The header the provider dedupes on, and how long it remembers a key.
    ``header == ""``: the provider documents no deduplication, so an effect
    whose outcome is unknown stays unknown until an operator resolves it."""

    header: str = ""
    window_seconds: float = 0.0
    #: the requests (method, path below the base URL) the provider dedupes;
    #: empty: every request. Elsewhere the key is ignored, so an unknown
    #: outcome there is never sent again.
    endpoints: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Pace:
    """The headers a provider paces its callers with, as it documents them.
    Empty names: not documented (or, where docs/providers.md says so, not
    confirmed)."""

    retry_after: bool = True  #: honours the standard ``Retry-After`` (seconds)
    limit: str = ""  #: requests allowed in the current window
    remaining: str = ""  #: requests left in it
    reset: str = ""  #: when the window resets
    reset_unit: Literal["", "seconds", "epoch_seconds"] = ""
    #: more pace headers the provider sends (daily quotas and the like)
    more: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preset:
    """One provider's documented facts. ``kind`` is the provider kind it
    configures; ``email_api`` names the mapping of ``POST /v1/email`` onto
    the provider's API (None: reached through ``/v1/http`` only)."""

    name: str
    title: str
    kind: Literal["http", "smtp"]
    auth: Auth
    idempotency: Idempotency = Idempotency()
    not_acted_statuses: frozenset[int] = DEFAULT_NOT_ACTED_STATUSES
    unknown_statuses: frozenset[int] = DEFAULT_UNKNOWN_STATUSES
    pace: Pace = Pace()
    #: HTTP: the base URL; ``{region}`` is filled from the provider's ``region``
    base_url: str = ""
    email_api: EmailApiName | None = None
    #: SMTP: where and how to connect
    host: str = ""
    port: int = 0
    tls: Literal["none", "starttls", "tls"] = "starttls"
    #: config keys this preset requires beyond the common ones
    requires: tuple[str, ...] = ()
    #: fact → the page of the provider's documentation that states it
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def _sources(**facts: str) -> Mapping[str, str]:
    return MappingProxyType(dict(facts))


_DAY = 24 * 3600.0

RESEND = Preset(
    name="resend", title="Resend (HTTP API)", kind="http",
    base_url="https://api.resend.com", email_api="resend",
    auth=Auth("bearer", env=("RESEND_API_KEY",)),
    # "Idempotency keys are currently supported on the POST /emails and the
    # POST /emails/batch endpoints": the rest of the API ignores the key
    idempotency=Idempotency("Idempotency-Key", _DAY,
                            frozenset({("POST", "emails"), ("POST", "emails/batch")})),
    # 409 concurrent_idempotent_requests: a request with the same key is still
    # being processed, so an earlier attempt of this effect reached Resend;
    # 409 invalid_idempotent_request cannot happen for one effect (its body is
    # the same on every attempt). Either way the outcome is not known here.
    unknown_statuses=DEFAULT_UNKNOWN_STATUSES | {409},
    # 401 missing_api_key, 403 invalid_api_key / unverified domain: refused
    # before anything was sent, like an SMTP AUTH refusal
    not_acted_statuses=DEFAULT_NOT_ACTED_STATUSES | {401, 403},
    pace=Pace(retry_after=True, limit="ratelimit-limit", remaining="ratelimit-remaining",
              reset="ratelimit-reset", reset_unit="seconds"),
    sources=_sources(
        base_url="https://resend.com/docs/api-reference",
        auth="https://resend.com/docs/api-reference",
        send="https://resend.com/docs/api-reference/emails/send-email",
        idempotency="https://resend.com/docs/dashboard/emails/idempotency-keys",
        errors="https://resend.com/docs/api-reference/errors",
        pace="https://resend.com/docs/api-reference/rate-limit",
    ),
)

RESEND_SMTP = Preset(
    name="resend-smtp", title="Resend (SMTP)", kind="smtp",
    host="smtp.resend.com", port=465, tls="tls",
    auth=Auth("smtp", env=("RESEND_API_KEY",), username="resend"),
    idempotency=Idempotency("Resend-Idempotency-Key", _DAY),
    sources=_sources(
        smtp="https://resend.com/docs/send-with-smtp",
        idempotency="https://resend.com/docs/dashboard/emails/idempotency-keys",
    ),
)

POSTMARK = Preset(
    name="postmark", title="Postmark", kind="http",
    base_url="https://api.postmarkapp.com", email_api="postmark",
    auth=Auth("header", env=("POSTMARK_SERVER_TOKEN",), header="X-Postmark-Server-Token"),
    # Postmark documents that it has no idempotency key
    idempotency=Idempotency(),
    # 401: "Missing or incorrect API token in header"
    not_acted_statuses=DEFAULT_NOT_ACTED_STATUSES | {401},
    pace=Pace(retry_after=True),
    sources=_sources(
        base_url="https://postmarkapp.com/developer/api/overview",
        auth="https://postmarkapp.com/developer/api/overview",
        send="https://postmarkapp.com/developer/user-guide/send-email-with-api",
        idempotency="https://postmarkapp.com/support/article/what-is-an-idempotency-key",
        errors="https://postmarkapp.com/developer/api/overview",
        errors_sdk="https://github.com/ActiveCampaign/postmark.js/blob/master/"
                   "src/client/errors/ErrorHandler.ts",
    ),
)

SENDGRID = Preset(
    name="sendgrid", title="Twilio SendGrid", kind="http",
    base_url="https://api.sendgrid.com", email_api="sendgrid",
    auth=Auth("bearer", env=("SENDGRID_API_KEY",)),
    idempotency=Idempotency(),
    # 401: "You do not have authorization to make the request"; 403 FORBIDDEN
    # (an unverified sender identity): refused before anything was queued
    not_acted_statuses=DEFAULT_NOT_ACTED_STATUSES | {401, 403},
    pace=Pace(retry_after=True, limit="X-RateLimit-Limit", remaining="X-RateLimit-Remaining",
              reset="X-RateLimit-Reset", reset_unit="epoch_seconds"),
    sources=_sources(
        base_url="https://www.twilio.com/docs/sendgrid/api-reference/mail-send/mail-send",
        auth="https://www.twilio.com/docs/sendgrid/api-reference/mail-send/mail-send",
        send="https://www.twilio.com/docs/sendgrid/api-reference/mail-send/mail-send",
        errors="https://sendgrid.com/docs/API_Reference/Web_API_v3/Mail/errors.html",
        message_id="https://www.twilio.com/docs/sendgrid/glossary/x-message-id",
        pace="https://www.twilio.com/docs/sendgrid/api-reference/"
             "how-to-use-the-sendgrid-v3-api/rate-limits",
    ),
)

MAILGUN = Preset(
    name="mailgun", title="Mailgun", kind="http",
    base_url="https://api.mailgun.net", email_api="mailgun",
    auth=Auth("basic", env=("MAILGUN_API_KEY",), username="api"),
    idempotency=Idempotency(),
    # 403: "Auth error or access denied"
    not_acted_statuses=DEFAULT_NOT_ACTED_STATUSES | {403},
    pace=Pace(retry_after=True),
    requires=("domain",),
    sources=_sources(
        base_url="https://documentation.mailgun.com/docs/mailgun/api-reference",
        auth="https://documentation.mailgun.com/docs/mailgun/api-reference/authentication",
        send="https://documentation.mailgun.com/docs/mailgun/api-reference/openapi-final/"
             "tag/Messages/",
        errors="https://documentation.mailgun.com/docs/mailgun/quickstart-guide/responses",
    ),
)

SES = Preset(
    name="ses", title="Amazon SES (API v2)", kind="http",
    base_url="https://email.{region}.amazonaws.com", email_api="ses",
    # "ses" is the signing name of botocore's sesv2 model (its endpoint prefix is "email")
    auth=Auth("sigv4", env=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                            "AWS_SESSION_TOKEN"), service="ses"),
    idempotency=Idempotency(),
    # SendEmail's documented 400s all say the message "can't be sent"
    # (MessageRejected, AccountSuspended, SendingPaused, MailFromDomainNotVerified,
    # BadRequest, LimitExceeded), a throttled message is dropped, 404 is a
    # missing configuration set, 403 a refused signature: nothing was sent
    not_acted_statuses=DEFAULT_NOT_ACTED_STATUSES | {400, 403, 404},
    # SES documents no rate-limit headers; throttling is an error type
    pace=Pace(retry_after=False),
    requires=("region",),
    sources=_sources(
        base_url="https://docs.aws.amazon.com/general/latest/gr/ses.html",
        auth="https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv.html",
        send="https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html",
        errors="https://docs.aws.amazon.com/ses/latest/APIReference-V2/CommonErrors.html",
        throttling="https://docs.aws.amazon.com/ses/latest/dg/manage-sending-quotas-errors.html",
    ),
)

SMTP_RELAY = Preset(
    name="smtp-relay", title="A generic SMTP relay (message submission)", kind="smtp",
    port=587, tls="starttls",
    auth=Auth("smtp", env=()),
    idempotency=Idempotency(),
    sources=_sources(
        submission="https://www.rfc-editor.org/rfc/rfc6409",
        starttls="https://www.rfc-editor.org/rfc/rfc3207",
        smtp="https://www.rfc-editor.org/rfc/rfc5321",
    ),
)

HUBSPOT = Preset(
    name="hubspot", title="HubSpot CRM", kind="http",
    base_url="https://api.hubapi.com",
    auth=Auth("bearer", env=("HUBSPOT_ACCESS_TOKEN",)),
    idempotency=Idempotency(),
    pace=Pace(retry_after=True, limit="X-HubSpot-RateLimit-Max",
              remaining="X-HubSpot-RateLimit-Remaining",
              more=("X-HubSpot-RateLimit-Interval-Milliseconds",
                    "X-HubSpot-RateLimit-Daily", "X-HubSpot-RateLimit-Daily-Remaining")),
    sources=_sources(
        base_url="https://developers.hubspot.com/docs/api-reference/legacy/account/"
                 "account-information/get-usage-details",
        auth="https://developers.hubspot.com/docs/api-reference/legacy/account/"
             "account-information/get-usage-details",
        errors="https://developers.hubspot.com/docs/api-reference/error-handling",
        pace="https://developers.hubspot.com/changelog/"
             "2018-11-06-rate-limit-information-headers-will-be-included-in-http-responses",
    ),
)

#: every preset, by the name ``preset = "..."`` takes
PRESETS: Mapping[str, Preset] = MappingProxyType({
    p.name: p for p in (RESEND, RESEND_SMTP, POSTMARK, SENDGRID, MAILGUN, SES, SMTP_RELAY,
                        HUBSPOT)
})

#: what a provider without a preset is paced by: the standard header alone
DEFAULT_PACE = Pace(retry_after=True)
