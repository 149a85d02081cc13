"""The OpenAPI 3.1 description, generated from the route table."""

from __future__ import annotations

import copy
import importlib.metadata
import re
from typing import TYPE_CHECKING, Any, get_args

from gateway.api.schemas import FIELDS, field
from gateway.wire import FENCE_RESOURCE, FENCE_TOKEN, IDEMPOTENCY_KEY, PROBLEMS, RateLimitReason
from leases.policy import RESOURCE_PATTERN

if TYPE_CHECKING:
    from gateway.api.routes import Route

GUARANTEE = (
    "Fenced, idempotent email and HTTP effects.\n\n"
    "**The guarantee:** no effect of fence F reaches a provider after fence F+1 was "
    "granted, and one idempotency key leads to at most one provider action. Each effect "
    "names its lease (`Fence-Resource`, `Fence-Token`) and its `Idempotency-Key`; a "
    "zombie's is refused with 412. Exactly what holds, and on what it rests: "
    "docs/gateway.md, section \"The guarantee, exactly\", in the repository.")

_EFFECT_HEADERS = [
    {"name": FENCE_RESOURCE, "in": "header", "required": True,
     "description": "The resource of the lease this effect is sent under.",
     "schema": {"type": "string", "pattern": f"^{RESOURCE_PATTERN.pattern}$",
                "examples": ["lead:42"]}},
    {"name": FENCE_TOKEN, "in": "header", "required": True,
     "description": "The fence the claim of that lease returned: a zombie's older one is "
                    "refused (412 stale_fence).",
     "schema": {"type": "string", "pattern": "^[0-9]{1,19}$", "examples": ["42"]}},
    {"name": IDEMPOTENCY_KEY, "in": "header", "required": True,
     "description": "One key per effect, the same on every retry of it: a repeat is "
                    "answered with the first answer (Idempotency-Replayed: true), never "
                    "sent twice.",
     "schema": {"type": "string", "minLength": 1, "maxLength": 255,
                "pattern": "^[\\x21-\\x7e][\\x20-\\x7e]*$", "examples": ["welcome-42"]}},
]
#: the path parameters, by name: (description, example)
_PATH_PARAMETERS = {
    "key": ("The effect's Idempotency-Key.", "welcome-42"),
    "resource": ("The resource of the lease.", "lead:42"),
    "provider": ("A configured HTTP provider's name.", "crm"),
    "path": ("The path at the provider, after its base URL.", "v1/contacts"),
}

_PROBLEM_SCHEMA = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": field({"type": "string"}, "A URI naming the problem's kind.",
                      "https://fencegate.dev/problems/stale-fence"),
        "title": field({"type": "string"}, "The kind, in words.", "Stale fence"),
        "status": field({"type": "integer"}, "The HTTP status.", 412),
        "detail": field({"type": "string"}, "What happened to this request.",
                        "fence 41 of lead:42 was superseded by fence 42"),
        "code": field({"type": "string", "enum": sorted(PROBLEMS)},
                      "The contract's code: what to do depends on it.", "stale_fence"),
        "current_fence": field({"type": "integer"}, "412: the resource's current fence.",
                               42),
        "reason": field({"type": "string", "enum": sorted(get_args(RateLimitReason)),
                         }, "rate_limited: the provider's configured rate, or a "
                            "pause the provider asked for with its own 429",
                        sorted(get_args(RateLimitReason))[0]),
    },
}


def _operation(route: Route) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True,
         "description": _PATH_PARAMETERS[name][0],
         "schema": {"type": "string", "examples": [_PATH_PARAMETERS[name][1]]}}
        for name in re.findall(r"\{(\w+)", route.path)
    ]
    if route.effect:
        params += _EFFECT_HEADERS
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": re.sub(r"\W+", "_", f"{route.method}_{route.openapi_path}").strip("_"),
        "parameters": params,
        "responses": {},
    }
    for status, text in sorted(route.answers.items()):
        op["responses"][str(status)] = _response(route, status, text)
    if route.auth:
        op["security"] = [{"bearer": []}]
        op["responses"].setdefault("401", _response(route, 401, "unauthenticated"))
    if route.body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": _described(route.body)}}}
    elif route.effect and route.method in ("POST", "PUT", "PATCH"):
        op["requestBody"] = {"required": False, "content": {"*/*": {"schema": {}}}}
    return op


def _response(route: Route, status: int, text: str) -> dict[str, Any]:
    """One answer: a success with the route's schema, or a problem document
    whose ``code`` is one of those named (``"stale_fence | no_lease"``)."""
    if status < 400:
        return {"description": text, "content": {route.result_type: {
            "schema": route.result if route.result is not None else {}}}}
    codes = [c.strip() for c in text.split("|")]
    wrong = [c for c in codes if c not in PROBLEMS or PROBLEMS[c][0] != status]
    if wrong:
        raise ValueError(f"{route.method} {route.path}: {status}: not its codes: {wrong}")
    schema = {"allOf": [{"$ref": "#/components/schemas/Problem"},
                        {"properties": {
                            "code": field({"enum": codes}, "The contract's code.", codes[0]),
                            "status": field({"const": status}, "The HTTP status.", status)}}]}
    return {"description": text, "content": {"application/problem+json": {"schema": schema}}}


def _described(schema: dict[str, Any]) -> dict[str, Any]:
    """A request body's schema with each field's description and example
    (``FIELDS``, by name) where it has none: a copy."""
    out = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        for name, prop in node.get("properties", {}).items():
            if name in FIELDS and "description" not in prop:
                prop["description"], example = FIELDS[name]
                prop["examples"] = [example]
            walk(prop)
            if isinstance(prop.get("items"), dict):
                walk(prop["items"])

    walk(out)
    return out


def version() -> str:
    """The installed package's version."""
    try:
        return importlib.metadata.version("fencegate")
    except importlib.metadata.PackageNotFoundError:  # run from a tree, not installed
        return "0+unknown"


def document(routes: tuple[Route, ...]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.openapi_path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "fencegate gateway", "version": version(),
                 "description": GUARANTEE},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Problem": _PROBLEM_SCHEMA},
        },
    }
