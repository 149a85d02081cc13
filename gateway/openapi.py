"""The OpenAPI 3.1 description, generated from the route table."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, get_args

from .wire import FENCE_RESOURCE, FENCE_TOKEN, IDEMPOTENCY_KEY, PROBLEMS, RateLimitReason

if TYPE_CHECKING:
    from .routes import Route

_EFFECT_HEADERS = [
    {"name": FENCE_RESOURCE, "in": "header", "required": True,
     "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:/@-]{1,200}$"}},
    {"name": FENCE_TOKEN, "in": "header", "required": True,
     "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"}},
    {"name": IDEMPOTENCY_KEY, "in": "header", "required": True,
     "schema": {"type": "string", "minLength": 1, "maxLength": 255,
                "pattern": "^[\\x21-\\x7e][\\x20-\\x7e]*$"}},
]

_PROBLEM_SCHEMA = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"}, "title": {"type": "string"},
        "status": {"type": "integer"}, "detail": {"type": "string"},
        "code": {"type": "string", "enum": sorted(PROBLEMS)},
        "current_fence": {"type": "integer"},
        "reason": {"type": "string", "enum": sorted(get_args(RateLimitReason)),
                   "description": "rate_limited: the provider's configured rate, or a "
                                  "pause the provider asked for with its own 429"},
    },
}


def _operation(route: Route) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
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
                             "content": {"application/json": {"schema": route.body}}}
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
                        {"properties": {"code": {"enum": codes},
                                        "status": {"const": status}}}]}
    return {"description": text, "content": {"application/problem+json": {"schema": schema}}}


def document(routes: tuple[Route, ...]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.openapi_path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "fencegate gateway", "version": "1",
                 "description": "Fenced, idempotent email and HTTP effects."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Problem": _PROBLEM_SCHEMA},
        },
    }
