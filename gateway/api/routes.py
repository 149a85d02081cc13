"""Every route of the gateway, as one table: the router and /openapi.json are
both built from ``ROUTES``, so they cannot drift apart."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

from gateway.api import email_body, parsing, schemas
from gateway.api.auth import check_provider, check_resource
from gateway.api.leases import body_field, claim_lease, release_lease, renew_lease, show_lease
from gateway.api.problems import Problem
from gateway.api.request import client_of, gw_of, read_body, read_json
from gateway.effects.effect import Effect, run_effect
from gateway.effects.fingerprint import NestedTooDeep
from gateway.effects.ratelimit import retry_after_header
from gateway.providers import HttpCall, Provider
from gateway.providers.base import caller_headers
from gateway.state import Gateway
from leases import database, migrate
from leases import policy as lease_policy
from leases.observe import exposition

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PROXY_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # aiohttp pattern
    handler: Handler
    summary: str
    auth: bool = True
    effect: bool = False
    body: dict[str, Any] | None = None  # JSON schema of the request body
    #: every status it can answer: the success described, each error as its codes
    answers: dict[int, str] = field(default_factory=dict)
    #: the JSON schema of a successful answer, and its media type
    result: dict[str, Any] | None = None
    result_type: str = "application/json"

    @property
    def reads_body(self) -> bool:
        """Whether the handler reads a body (and takes its slot once it has it)."""
        return self.effect or self.body is not None

    @property
    def openapi_path(self) -> str:
        return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", self.path)


def provider_named(gw: Gateway, name: str, kind: Literal["smtp", "http"]) -> Provider:
    provider = gw.providers.get(name)
    if provider is None or provider.config.kind != kind:
        raise parsing.bad("provider", f"{name[:64]!r} is not a configured {kind} provider")
    return provider


def email_provider(gw: Gateway, name: str | None) -> Provider:
    """The provider of ``POST /v1/email``: the one the body names, else the
    only one that sends email (SMTP, or an HTTP provider with an email preset)."""
    if name is None:
        name = gw.config.default_email_provider
        if name is None:
            raise parsing.bad("provider", "is required: more than one email provider is "
                               "configured" if any(p.config.serves_email
                                                   for p in gw.providers.values())
                               else "is required: no email provider is configured")
    provider = gw.providers.get(name)
    if provider is None or not provider.config.serves_email:
        raise parsing.bad("provider", f"{name[:64]!r} is not a configured email provider "
                           "(an smtp provider, or an http one with an email preset)")
    return provider


def checked_headers(request: web.Request) -> parsing.EffectHeaders:
    """The effect's three headers, and the client's right to its resource."""
    headers = parsing.effect_headers(request.headers)
    check_resource(client_of(request), headers.resource)
    return headers


# ---- effects ---------------------------------------------------------------

async def send_email(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    headers = checked_headers(request)
    raw = await read_body(request)
    email = email_body.email_request(parsing.json_value(raw))
    provider = email_provider(gw, email.provider)
    check_provider(client_of(request), provider.config.name)
    email_body.owned_header(email, provider.config.idempotency_header)
    effect = Effect.email(client_of(request).name, headers, provider, email, raw)
    return await run_effect(gw, effect)


async def proxy_http(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    headers = checked_headers(request)
    name = request.match_info["provider"]
    prefix = f"/v1/http/{name}/"
    raw_path = request.rel_url.raw_path
    if not raw_path.startswith(prefix):
        raise parsing.bad("path", "must follow /v1/http/{provider}/")
    path = parsing.provider_path(raw_path[len(prefix):])
    provider = provider_named(gw, name, "http")
    check_provider(client_of(request), name, path)
    body = await read_body(request)
    try:
        effect = Effect.http(
            client_of(request).name, headers, provider, method=request.method, path=path,
            query=request.rel_url.raw_query_string,
            forwarded=caller_headers(request.headers.items()), body=body,
            content_type=request.content_type)
    except NestedTooDeep:
        raise parsing.bad("body", "is JSON nested too deeply") from None
    assert isinstance(effect.call, HttpCall)
    parsing.joined_fields_fit(parsing.utf8_headers(effect.call.forwarded))
    return await run_effect(gw, effect)


# ---- leases ----------------------------------------------------------------

def _effect_key(request: web.Request) -> str:
    """The key in the path, decoded; one no Idempotency-Key can be (a NUL,
    which PostgreSQL cannot hold in text, among them) names no effect."""
    key = request.match_info["key"]
    if not parsing.is_key(key):
        raise Problem("not_found", "no effect with this Idempotency-Key for this client")
    return key


async def show_effect(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    key = _effect_key(request)
    await gw.ledger.settled(client_of(request).name, key)
    effect = await gw.ledger.show(client_of(request).name, key)
    if effect is None:
        raise Problem("not_found", "no effect with this Idempotency-Key for this client")
    return web.json_response(effect)


async def resolve_effect(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    key = _effect_key(request)
    body = await read_json(request)
    outcome = body_field(body, "outcome", str)
    if outcome not in ("sent", "not_sent"):
        raise parsing.bad("outcome", 'must be "sent" or "not_sent"')
    client = client_of(request).name
    if not await gw.ledger.resolve(client, key, outcome, operator=client):
        why = await gw.ledger.why_unresolved(client, key, outcome)
        raise Problem(why.code, why.detail, headers={} if why.retry_after is None else {
            "Retry-After": retry_after_header(why.retry_after)})
    return web.json_response({"idempotency_key": key, "resolved": outcome})


# ---- service ---------------------------------------------------------------

async def healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)

    async with database.answered(gw.config.server.database_timeout_seconds):
        async with gw.pool.acquire() as conn:
            found = await migrate.schema_state(conn)
    why = migrate.usable(found, migrate.latest_version())
    if why is not None:
        raise Problem("unavailable", why)
    return web.json_response({"status": "ready", "schema_version": found.version,
                              "code_schema_version": migrate.latest_version()})


async def metrics(request: web.Request) -> web.StreamResponse:
    observer = gw_of(request).observer
    if observer is not None:  # queue depths and fencegate_database_up, this process's view
        await observer.refresh()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        text = exposition(observer, registry)
    else:
        text = exposition(observer, REGISTRY)
    return web.Response(body=text, headers={"Content-Type": "text/plain; version=0.0.4"})


async def openapi(request: web.Request) -> web.StreamResponse:
    from gateway.api.openapi import document

    return web.json_response(document(ROUTES))


_EMAIL_SCHEMA = {
    "type": "object", "required": ["from", "to", "subject"], "additionalProperties": False,
    "properties": {
        "provider": {"type": "string"}, "from": {"type": "string"},
        "to": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "cc": {"type": "array", "items": {"type": "string"}},
        "bcc": {"type": "array", "items": {"type": "string"}},
        "reply_to": {"type": "string"}, "subject": {"type": "string"},
        "text": {"type": "string"}, "html": {"type": "string"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "attachments": {"type": "array", "maxItems": email_body.MAX_ATTACHMENTS, "items": {
            "type": "object", "required": ["filename", "content"],
            "additionalProperties": False,
            "properties": {
                "filename": {"type": "string", "minLength": 1,
                             "maxLength": email_body.MAX_FILENAME},
                "content": {"type": "string", "contentEncoding": "base64"},
                "content_type": {"type": "string"},
            }}},
    },
}
_RESOURCE = {"type": "string", "pattern": f"^{lease_policy.RESOURCE_PATTERN.pattern}$"}
_FENCE = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
_TTL = {"type": "number", "minimum": lease_policy.MIN_TTL_SECONDS,
        "maximum": lease_policy.MAX_TTL_SECONDS}


def _lease_schema(*required: str) -> dict[str, Any]:
    props = {"resource": _RESOURCE, "owner": {"type": "string", "minLength": 1,
                                              "maxLength": 200},
             "fence": _FENCE, "ttl_seconds": _TTL}
    return {"type": "object", "required": list(required),
            "properties": {k: v for k, v in props.items() if k in required or k == "owner"}}


_EFFECT_ANSWERS = {200: "the provider's answer (or a replay of it)", 400: "bad_request",
                   401: "unauthenticated", 403: "forbidden_resource | forbidden_provider",
                   408: "request_timeout",
                   409: "effect_in_progress | effect_outcome_unknown",
                   412: "stale_fence | lease_expired | no_lease | invalid_fence",
                   413: "payload_too_large", 422: "idempotency_key_reused | provider_rejected",
                   429: "rate_limited", 500: "internal_error",
                   502: "provider_error | provider_outcome_unknown",
                   503: "unavailable | overloaded", 504: "provider_timeout"}
#: what every route that reads a JSON body can answer besides its own
_BODY_ANSWERS = {400: "bad_request", 401: "unauthenticated", 403: "forbidden_resource",
                 408: "request_timeout", 413: "payload_too_large", 500: "internal_error",
                 503: "unavailable"}
_READ_ANSWERS = {401: "unauthenticated", 500: "internal_error", 503: "unavailable"}

ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/email", send_email,
          "Send one email through an email provider (SMTP or an HTTP email API)",
          effect=True, body=_EMAIL_SCHEMA, answers=_EFFECT_ANSWERS, result=schemas.EMAIL_SENT),
    *(Route(m, "/v1/http/{provider}/{path:.*}", proxy_http,
            f"Forward a {m} request to a configured HTTP provider", effect=True,
            # 404: a path no route matches (a provider name with characters none has)
            answers={**_EFFECT_ANSWERS, 404: "not_found"}, result_type="*/*")
      for m in PROXY_METHODS),
    Route("POST", "/v1/leases/claim", claim_lease, "Claim a lease",
          body=_lease_schema("resource", "ttl_seconds"),
          answers={200: "the lease", **_BODY_ANSWERS, 409: "lease_held"}, result=schemas.LEASE),
    Route("POST", "/v1/leases/renew", renew_lease, "Renew a lease",
          body=_lease_schema("resource", "owner", "fence", "ttl_seconds"),
          answers={200: "the lease, with its new expiry", **_BODY_ANSWERS, 409: "lease_lost"},
          result=schemas.LEASE),
    Route("POST", "/v1/leases/release", release_lease, "Release a lease",
          body=_lease_schema("resource", "owner", "fence"),
          answers={200: "whether a live lease of this owner and fence was ended",
                   **_BODY_ANSWERS}, result=schemas.RELEASED),
    # any characters: one outside the resource alphabet is a 400 that names it, not a 404
    Route("GET", "/v1/leases/{resource:[\\s\\S]+}", show_lease, "Show a resource's lease",
          answers={200: "the lease (fence null: never claimed)", 400: "bad_request",
                   403: "forbidden_resource", **_READ_ANSWERS}, result=schemas.LEASE_SHOWN),
    Route("GET", "/v1/effects/{key}", show_effect, "Show an effect",
          answers={200: "the effect", 404: "not_found", **_READ_ANSWERS},
          result=schemas.EFFECT),
    Route("POST", "/v1/effects/{key}/resolve", resolve_effect,
          "Settle an effect whose outcome is unknown",
          body={"type": "object", "required": ["outcome"],
                "properties": {"outcome": {"enum": ["sent", "not_sent"]}}},
          answers={200: "resolved", **_BODY_ANSWERS, 404: "not_found",
                   409: "effect_not_unknown | effect_in_progress"}, result=schemas.RESOLVED),
    *(Route(m, "/healthz", healthz, "Liveness", auth=False, answers={200: "alive"},
            result=schemas.HEALTH) for m in ("GET", "HEAD")),
    *(Route(m, "/readyz", readyz, "Readiness: database reachable and migrated", auth=False,
            answers={200: "ready", 500: "internal_error", 503: "unavailable"},
            result=schemas.READY) for m in ("GET", "HEAD")),
    Route("GET", "/metrics", metrics, "Prometheus metrics", auth=False,
          answers={200: "text format"}, result={"type": "string"},
          result_type="text/plain"),
    Route("GET", "/openapi.json", openapi, "This description", auth=False,
          answers={200: "OpenAPI 3.1"}, result={"type": "object"}),
)
