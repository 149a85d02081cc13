"""A tool's arguments checked against its schema (the subset of JSON Schema
that ``gateway.mcp.specs`` uses), with a message that names the argument, so
a model can correct its call. Pure; nothing here raises but ``BadArguments``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "number": (int, float),
                                       "integer": (int,), "array": (list,),
                                       "object": (dict,), "boolean": (bool,)}


class BadArguments(ValueError):
    """The arguments do not fit the tool's schema; the message says which."""


def check(schema: Mapping[str, Any], arguments: Any) -> dict[str, Any]:
    """``arguments`` as a dict, or ``BadArguments``."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise BadArguments("the arguments must be a JSON object")
    props: Mapping[str, Any] = schema.get("properties", {})
    unknown = sorted(set(arguments) - set(props))
    if unknown and schema.get("additionalProperties") is False:
        raise BadArguments(f"unknown argument {unknown[0]!r} (known: "
                           f"{', '.join(props) or 'none'})")
    for name in schema.get("required", ()):
        if arguments.get(name) is None:
            raise BadArguments(f"{name!r} is required")
    try:
        for name, value in arguments.items():
            if value is not None and name in props:
                _encodable(name, value)
                _value(name, props[name], value)
    except RecursionError:
        raise BadArguments("the arguments are nested too deep") from None
    return {k: v for k, v in arguments.items() if v is not None}


def _encodable(name: str, value: Any) -> None:
    """What JSON can carry, and only that: a library caller may hand a set,
    bytes or NaN that the derived key and the gateway's body cannot encode."""
    try:
        json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError):
        raise BadArguments(f"{name!r} must be plain JSON (objects with string keys, "
                           "arrays, strings, finite numbers, booleans, null)") from None


def _value(name: str, schema: Mapping[str, Any], value: Any) -> None:
    kind = schema.get("type")
    if kind is not None:
        wanted = _TYPES[kind]
        if not isinstance(value, wanted) or (isinstance(value, bool) and kind != "boolean"):
            raise BadArguments(f"{name!r} must be {'an' if kind[0] in 'aeio' else 'a'} {kind}")
    if "enum" in schema and value not in schema["enum"]:
        raise BadArguments(f"{name!r} must be one of {', '.join(map(str, schema['enum']))}")
    if isinstance(value, str):
        _string(name, schema, value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise BadArguments(f"{name!r} must be at least {schema['minimum']:g}")
        if "maximum" in schema and value > schema["maximum"]:
            raise BadArguments(f"{name!r} must be at most {schema['maximum']:g}")
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise BadArguments(f"{name!r} must have at least {schema['minItems']} item(s)")
        if len(value) > schema.get("maxItems", len(value)):
            raise BadArguments(f"{name!r} must have at most {schema['maxItems']} items")
        for item in value:
            _value(f"{name}[]", schema.get("items", {}), item)


def _string(name: str, schema: Mapping[str, Any], value: str) -> None:
    if len(value) < schema.get("minLength", 0):
        raise BadArguments(f"{name!r} must not be empty" if schema["minLength"] == 1 else
                           f"{name!r} must be at least {schema['minLength']} characters")
    if len(value) > schema.get("maxLength", len(value)):
        raise BadArguments(f"{name!r} must be at most {schema['maxLength']} characters")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        raise BadArguments(f"{name!r} has characters it may not have")
