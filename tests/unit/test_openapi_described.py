"""/openapi.json (drawn by /docs) says which fencegate it describes, what
each field means with a real example that its own schema accepts, and where
the guarantee is written down."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Any

import jsonschema_rs

from gateway.api.openapi import document
from gateway.api.routes import ROUTES

DOC = document(ROUTES)


def _fields(schema: dict[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, prop in schema.get("properties", {}).items():
        if not prop:  # an override inside allOf (code, status): described in Problem
            continue
        yield f"{where}.{name}", prop
        yield from _fields(prop, f"{where}.{name}")
        if isinstance(prop.get("items"), dict):
            yield from _fields(prop["items"], f"{where}.{name}[]")
    for part in schema.get("allOf", []):
        yield from _fields(part, where)


def _schemas() -> Iterator[tuple[str, dict[str, Any]]]:
    yield "Problem", DOC["components"]["schemas"]["Problem"]
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                yield f"{method} {path} body", body["schema"]
            ok = op["responses"].get("200", {}).get("content", {})
            for answer in ok.values():
                yield f"{method} {path} 200", answer["schema"]


def test_the_title_carries_the_package_version() -> None:
    assert DOC["info"]["version"] == importlib.metadata.version("fencegate")
    assert DOC["info"]["title"] == "fencegate gateway"


def test_the_guarantee_is_linked() -> None:
    text = DOC["info"]["description"]
    assert "docs/gateway.md" in text and "The guarantee, exactly" in text
    assert "fence F+1" in text


def test_every_field_is_described_with_a_real_example() -> None:
    seen = 0
    for where, schema in _schemas():
        for name, field in _fields(schema, where):
            seen += 1
            assert field.get("description"), name
            assert "examples" in field, name
            for example in field["examples"]:
                assert example != "string", name
                jsonschema_rs.validate({k: v for k, v in field.items()
                                        if k not in ("description", "examples")}, example)
    assert seen > 40


def test_every_header_and_path_parameter_is_described() -> None:
    for ops in DOC["paths"].values():
        for op in ops.values():
            for p in op["parameters"]:
                assert p.get("description") and p["schema"].get("examples"), p["name"]
