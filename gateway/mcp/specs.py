"""The five tools of a run, as data: name, description, JSON Schema of the
arguments and honest annotations. The MCP server lists them as they are;
``gateway.mcp.adapter`` hands them to frameworks that do not speak MCP.

Annotations (MCP's hints; a client may show or gate tools on them):

- ``claim_run``: not read-only (it takes a lease), not destructive, idempotent
  (claiming the run this session already holds answers the same run).
- ``send_email``, ``http_request``: not read-only, destructive (an email
  cannot be taken back, an HTTP call may delete), idempotent: a repeated
  identical call, or one with the same ``idempotency_key``, is replayed by
  the gateway, never sent twice. Open world: they reach outside systems.
- ``release_run``: not read-only, not destructive (it gives the run up, the
  fence stays), idempotent.
- ``run_status``: read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

#: a claim's ttl when the model gives none; renewed every third of it
DEFAULT_TTL_SECONDS: Final = 60.0
MIN_TTL_SECONDS: Final = 1.0
MAX_TTL_SECONDS: Final = 3600.0

_KEY = {"type": "string", "minLength": 1, "maxLength": 200,
        "description": "Optional: your own name for this effect. Calls with the same key are "
                       "one effect (replayed, never repeated). Omitted: derived from the run "
                       "and the arguments, so an identical repeated call is replayed."}
_ADDRESS = {"type": "string", "minLength": 3, "maxLength": 320}
_ADDRESSES = {"type": "array", "items": _ADDRESS, "minItems": 1, "maxItems": 100}

_STOP_NOTE = ("If the answer is an error starting with stale_fence, lease_expired, no_lease, "
              "invalid_fence or run_released, this run is no longer yours: stop working on it.")


@dataclass(frozen=True)
class ToolSpec:
    """One tool: what a model sees of it."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


TOOLS: Final[tuple[ToolSpec, ...]] = (
    ToolSpec(
        "claim_run", "Claim the run",
        "Claim the run (a resource such as run:42) before acting on it. One session works "
        "for one run: the lease is kept renewed while the session lives, and every email "
        "and HTTP call of the session is sent under its fence. Answers the run's fence "
        "and until when it is held; lease_held means another agent is working on it: do "
        "not act on it.",
        _object({"resource": {"type": "string", "minLength": 1, "maxLength": 200,
                              "pattern": "^[A-Za-z0-9._:/@-]+$",
                              "description": "the run's resource, e.g. run:42"},
                 "ttl_seconds": {"type": "number", "minimum": MIN_TTL_SECONDS,
                                 "maximum": MAX_TTL_SECONDS,
                                 "description": f"lease length (default "
                                                f"{DEFAULT_TTL_SECONDS:g}); renewed every "
                                                "third of it"}},
                ("resource",)),
        read_only=False, destructive=False, idempotent=True, open_world=False),
    ToolSpec(
        "send_email", "Send an email (fenced)",
        "Send one email through the fencegate gateway under this run's fence (text or "
        "html, or both). Needs a claimed run. Retrying the identical call is safe: it is "
        "replayed, never sent twice. " + _STOP_NOTE,
        _object({"from": _ADDRESS, "to": _ADDRESSES, "cc": _ADDRESSES, "bcc": _ADDRESSES,
                 "reply_to": _ADDRESS,
                 "subject": {"type": "string", "maxLength": 998},
                 "text": {"type": "string"}, "html": {"type": "string"},
                 "provider": {"type": "string", "minLength": 1, "maxLength": 100,
                              "description": "one of the gateway's email providers "
                                             "(default: its only one)"},
                 "idempotency_key": _KEY},
                ("to", "subject")),
        read_only=False, destructive=True, idempotent=True, open_world=True),
    ToolSpec(
        "http_request", "Call an HTTP provider (fenced)",
        "Send one HTTP request to a provider configured in the gateway (a CRM, a "
        "webhook), under this run's fence. Needs a claimed run. Retrying the identical "
        "call is safe: it is replayed, never sent twice. " + _STOP_NOTE,
        _object({"provider": {"type": "string", "minLength": 1, "maxLength": 100},
                 "method": {"type": "string",
                            "enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
                 "path": {"type": "string", "maxLength": 2000,
                          "description": "under the provider's base URL, e.g. "
                                         "contacts/42/notes"},
                 "json": {"description": "the JSON body, if any"},
                 "idempotency_key": _KEY},
                ("provider", "method", "path")),
        read_only=False, destructive=True, idempotent=True, open_world=True),
    ToolSpec(
        "release_run", "Release the run",
        "Give the run up when its work is done, so another agent may claim it. The "
        "session's effect tools refuse from then on.",
        _object({}), read_only=False, destructive=False, idempotent=True, open_world=False),
    ToolSpec(
        "run_status", "Run status",
        "Whether this session holds its run, under which fence, and until when; after a "
        "loss, why (stale_fence, lease_expired, ...).",
        _object({}), read_only=True, destructive=False, idempotent=True, open_world=False),
)

BY_NAME: Final[dict[str, ToolSpec]] = {t.name: t for t in TOOLS}
