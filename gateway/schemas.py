"""JSON schemas of the gateway's successful answers, for /openapi.json (the
request bodies' schemas sit with the route table, gateway/routes.py)."""

from __future__ import annotations

from typing import Any

_TIME = {"type": "string", "format": "date-time",
         "description": "RFC 3339, UTC, milliseconds: 2025-11-30T09:18:04.123Z"}
_FENCE = {"type": "integer", "minimum": 1}

LEASE: dict[str, Any] = {
    "type": "object", "required": ["resource", "owner", "fence", "expires_at", "ttl_seconds"],
    "properties": {"resource": {"type": "string"}, "owner": {"type": "string"},
                   "fence": _FENCE, "expires_at": _TIME, "ttl_seconds": {"type": "number"}},
}
RELEASED: dict[str, Any] = {
    "type": "object", "required": ["released"], "properties": {"released": {"type": "boolean"}},
}
LEASE_SHOWN: dict[str, Any] = {
    "type": "object", "required": ["resource", "owner", "fence", "expires_at", "live"],
    "properties": {"resource": {"type": "string"}, "owner": {"type": ["string", "null"]},
                   "fence": {"type": ["integer", "null"]},
                   "expires_at": {**_TIME, "type": ["string", "null"]},
                   "live": {"type": "boolean"}},
}
EFFECT: dict[str, Any] = {
    "type": "object",
    "required": ["idempotency_key", "client", "resource", "fence", "provider", "state",
                 "attempts", "created_at", "updated_at", "deadline", "provider_response"],
    "properties": {
        "idempotency_key": {"type": "string"}, "client": {"type": "string"},
        "resource": {"type": "string"}, "fence": _FENCE, "provider": {"type": "string"},
        "state": {"enum": ["in_flight", "succeeded", "failed", "unknown"]},
        "attempts": {"type": "integer"}, "created_at": _TIME, "updated_at": _TIME,
        "deadline": _TIME, "retry_until": {**_TIME, "type": ["string", "null"]},
        "resolvable_in_seconds": {
            "type": ["number", "null"],
            "description": "in_flight or unknown: seconds until resolve is accepted"},
        "provider_response": {
            "type": "object", "properties": {"status": {"type": ["integer", "null"]},
                                             "summary": {"type": ["string", "null"]}}},
    },
}
RESOLVED: dict[str, Any] = {
    "type": "object", "required": ["idempotency_key", "resolved"],
    "properties": {"idempotency_key": {"type": "string"},
                   "resolved": {"enum": ["sent", "not_sent"]}},
}
EMAIL_SENT: dict[str, Any] = {
    "type": "object", "required": ["status", "message_id", "provider"],
    "properties": {"status": {"const": "sent"}, "message_id": {"type": "string"},
                   "provider": {"type": "string"},
                   "provider_message_id": {"type": ["string", "null"]},
                   "provider_response": {"type": "object"},
                   "resolved_by_operator": {"type": "boolean"}},
}
HEALTH: dict[str, Any] = {
    "type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}},
}
READY: dict[str, Any] = {
    "type": "object", "required": ["status", "schema_version", "code_schema_version"],
    "properties": {"status": {"const": "ready"}, "schema_version": {"type": "integer"},
                   "code_schema_version": {"type": "integer"}},
}
