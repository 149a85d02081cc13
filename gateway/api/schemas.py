"""JSON schemas of the gateway's successful answers, for /openapi.json (the
request bodies' schemas sit with the route table, gateway/api/routes.py; their
fields are described by name here, in ``FIELDS``). Every field has a
description and a real example, which its own schema accepts
(tests/unit/test_openapi_described.py)."""

from __future__ import annotations

from typing import Any

TIME_EXAMPLE = "2025-11-30T09:18:04.123Z"


def field(schema: dict[str, Any], description: str, example: Any) -> dict[str, Any]:
    """``schema`` with its description and one example."""
    return {**schema, "description": description, "examples": [example]}


_TIME = {"type": "string", "format": "date-time"}
_TIME_NOTE = "RFC 3339, UTC, milliseconds"
_FENCE = {"type": "integer", "minimum": 1}

#: fields of the request bodies (and headers) by name: (description, example)
FIELDS: dict[str, tuple[str, Any]] = {
    "resource": ("What the lease is on: one name per thing a worker acts on (a lead, a "
                 "run, a job). Letters, digits and ._:/@-, at most 200.", "lead:42"),
    "owner": ("Who holds the lease: the worker's name, for logs and the console; a "
              "claim without one gets a random one.", "worker-7"),
    "fence": ("The fence the claim returned: a number that grows with every claim of "
              "the resource. The gateway accepts only the resource's newest.", 42),
    "ttl_seconds": ("How long the lease lasts unless renewed, in seconds.", 30),
    "provider": ("Which configured provider sends it (the client's default when "
                 "omitted).", "mail"),
    "from": ("The sender, an address or a name and an address.",
             "Ada <agent@example.com>"),
    "to": ("The recipients: at least one address.", ["lead@example.com"]),
    "cc": ("Copied recipients.", ["sales@example.com"]),
    "bcc": ("Hidden recipients: in the envelope, not in the message's headers.",
            ["audit@example.com"]),
    "reply_to": ("Where replies go.", "sales@example.com"),
    "subject": ("The subject line (encoded as needed).", "Your quote, as promised"),
    "text": ("The plain-text body.", "Hello Grace, here is the quote we discussed."),
    "html": ("The HTML body, sent alongside the text one when both are given.",
             "<p>Hello Grace, here is the quote we discussed.</p>"),
    "headers": ("Extra message headers; the gateway's own (Message-ID, Date, ...) "
                "cannot be set.", {"X-Campaign": "spring"}),
    "attachments": ("Files attached to the message.",
                    [{"filename": "quote.pdf", "content": "JVBERi0xLjcK",
                      "content_type": "application/pdf"}]),
    "filename": ("The attachment's file name.", "quote.pdf"),
    "content": ("The attachment's bytes, base64.", "JVBERi0xLjcK"),
    "content_type": ("The attachment's media type (guessed from the name when "
                     "omitted).", "application/pdf"),
    "outcome": ("What the operator found at the provider: sent (it acted: store it as "
                "succeeded) or not_sent (it did not: free the key).", "not_sent"),
}

LEASE: dict[str, Any] = {
    "type": "object", "required": ["resource", "owner", "fence", "expires_at", "ttl_seconds"],
    "properties": {
        "resource": field({"type": "string"}, "The resource claimed.", "lead:42"),
        "owner": field({"type": "string"}, "The lease's holder.", "worker-7"),
        "fence": field(_FENCE, "The fence to send with every effect under this lease "
                       "(header Fence-Token).", 42),
        "expires_at": field(_TIME, f"When the lease ends unless renewed ({_TIME_NOTE}).",
                            TIME_EXAMPLE),
        "ttl_seconds": field({"type": "number"}, "The lease's length, in seconds.", 30)},
}
RELEASED: dict[str, Any] = {
    "type": "object", "required": ["released"],
    "properties": {"released": field({"type": "boolean"}, "Whether this call ended the "
                                     "lease (false: it had ended or passed on).", True)},
}
LEASE_SHOWN: dict[str, Any] = {
    "type": "object", "required": ["resource", "owner", "fence", "expires_at", "live"],
    "properties": {
        "resource": field({"type": "string"}, "The resource asked about.", "lead:42"),
        "owner": field({"type": ["string", "null"]}, "Its latest holder (null: never "
                       "claimed).", "worker-7"),
        "fence": field({"type": ["integer", "null"]}, "Its newest fence (null: never "
                       "claimed).", 42),
        "expires_at": field({**_TIME, "type": ["string", "null"]},
                            f"When its latest lease ends or ended ({_TIME_NOTE}).",
                            TIME_EXAMPLE),
        "live": field({"type": "boolean"}, "Whether a lease on it is live now.", True)},
}
EFFECT: dict[str, Any] = {
    "type": "object",
    "required": ["idempotency_key", "client", "resource", "fence", "provider", "state",
                 "attempts", "created_at", "updated_at", "deadline", "provider_response"],
    "properties": {
        "idempotency_key": field({"type": "string"}, "The effect's key (header "
                                 "Idempotency-Key).", "welcome-42"),
        "client": field({"type": "string"}, "The client that sent it.", "agents"),
        "resource": field({"type": "string"}, "The lease it was sent under.", "lead:42"),
        "fence": field(_FENCE, "The fence it was sent under.", 42),
        "provider": field({"type": "string"}, "The provider it went to.", "mail"),
        "state": field({"enum": ["in_flight", "succeeded", "failed", "unknown"]},
                       "in_flight: being sent; succeeded or failed: the provider "
                       "answered; unknown: no one knows whether it acted (resolve it).",
                       "unknown"),
        "attempts": field({"type": "integer"}, "How many times it was admitted to be "
                          "sent.", 1),
        "created_at": field(_TIME, f"When it was first admitted ({_TIME_NOTE}).",
                            TIME_EXAMPLE),
        "updated_at": field(_TIME, f"Its last change ({_TIME_NOTE}).", TIME_EXAMPLE),
        "deadline": field(_TIME, f"Its last attempt's deadline ({_TIME_NOTE}).",
                          TIME_EXAMPLE),
        "retry_until": field({**_TIME, "type": ["string", "null"]},
                             "While in the future, the provider dedupes on our key, so an "
                             f"unknown effect may be sent again ({_TIME_NOTE}).",
                             TIME_EXAMPLE),
        "resolvable_in_seconds": field(
            {"type": ["number", "null"]},
            "in_flight or unknown: seconds until resolve is accepted", 0),
        "request_summary": field(
            {"type": ["object", "null"]},
            "The request as sent, in brief (kept so an operator can check with the "
            "provider): for an email, from, to, cc, bcc, subject, its own header names, "
            "attachment names and sizes and the body's sizes; for an HTTP call, method, "
            "path (secrets in the query blanked), the forwarded header names, the body's "
            "size and content type. Never a body or a header's value; lists are cut at 20 "
            "entries (`<name>_omitted` says how many more), strings at 200 characters.",
            {"kind": "http", "method": "POST", "path": "contacts?api_key=***",
             "headers": ["Content-Type"], "body_bytes": 42,
             "content_type": "application/json"}),
        "provider_response": field(
            {"type": "object", "properties": {
                "status": field({"type": ["integer", "null"]}, "The provider's status "
                                "code (SMTP or HTTP), if it answered.", 250),
                "summary": field({"type": ["string", "null"]}, "What it said, or what "
                                 "went wrong.", "250 2.0.0 Ok: queued as 4F2A")}},
            "The provider's latest answer.", {"status": 250,
                                              "summary": "250 2.0.0 Ok: queued as 4F2A"}),
    },
}
RESOLVED: dict[str, Any] = {
    "type": "object", "required": ["idempotency_key", "resolved"],
    "properties": {
        "idempotency_key": field({"type": "string"}, "The effect resolved.", "welcome-42"),
        "resolved": field({"enum": ["sent", "not_sent"]}, "The outcome recorded.",
                          "not_sent")},
}
EMAIL_SENT: dict[str, Any] = {
    "type": "object", "required": ["status", "message_id", "provider"],
    "properties": {
        "status": field({"const": "sent"}, "The provider took the message.", "sent"),
        "message_id": field({"type": "string"}, "The message's Message-ID, derived from "
                            "the client and the key (the same on a replay).",
                            "<ceee7a5f7dfe48a5971bdcbca0d6e62749ec879e@fencegate>"),
        "provider": field({"type": "string"}, "The provider that sent it.", "mail"),
        "provider_message_id": field({"type": ["string", "null"]}, "The provider's own "
                                     "id for it, when it gives one.", "4F2A"),
        "provider_response": field({"type": "object"}, "The provider's answer.",
                                   {"status": 250, "summary": "250 2.0.0 Ok"}),
        "resolved_by_operator": field({"type": "boolean"}, "True when an operator "
                                      "resolved it as sent: no provider answer is stored.",
                                      False)},
}
HEALTH: dict[str, Any] = {
    "type": "object", "required": ["status"],
    "properties": {"status": field({"const": "ok"}, "The process is up.", "ok")},
}
READY: dict[str, Any] = {
    "type": "object", "required": ["status", "schema_version", "code_schema_version"],
    "properties": {
        "status": field({"const": "ready"}, "The database answers, its schema fits.",
                        "ready"),
        "schema_version": field({"type": "integer"}, "The database's newest migration.",
                                10),
        "code_schema_version": field({"type": "integer"}, "The newest migration this "
                                     "code knows.", 10)},
}
