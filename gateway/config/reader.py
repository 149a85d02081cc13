"""Typed access to one table of the TOML configuration, with errors that name
the file and the key (``gw.toml: providers.crm.base_url: must be ...``)."""

from __future__ import annotations

import os
from typing import Any

from gateway.errors import ConfigError


class Reader:
    """Typed access to one TOML table, with errors that name file and key."""

    def __init__(self, source: str, prefix: str, table: Any) -> None:
        self.source, self.prefix = source, prefix
        if not isinstance(table, dict):
            raise self.error("", "must be a table")
        self.table: dict[str, Any] = table

    def error(self, key: str, message: str) -> ConfigError:
        where = ".".join(p for p in (self.prefix, key) if p)
        return ConfigError(f"{self.source}: {where}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None,
            required: bool = False) -> Any:
        if key not in self.table:
            if required:
                raise self.error(key, "is required")
            return default
        value = self.table[key]
        if isinstance(value, bool) and kind is not bool:
            raise self.error(key, f"must be {_kind_name(kind)}")
        if not isinstance(value, kind):
            raise self.error(key, f"must be {_kind_name(kind)}")
        return value

    def number(self, key: str, default: float, low: float, high: float) -> float:
        value = float(self.get(key, (int, float), default))
        if not low <= value <= high:
            raise self.error(key, f"must be between {low:g} and {high:g}")
        return value

    def secret(self, key: str) -> str | None:
        """The value of the environment variable named by ``key``, if set in the file."""
        env = self.get(key, str)
        if env is None or env == "":
            return None
        value = os.environ.get(env)
        if value is None:
            raise self.error(key, f"names the environment variable {env}, which is not set")
        return value

    def check_unknown(self, known: set[str]) -> None:
        for key in self.table:
            if key not in known:
                raise self.error(key, "is not a known key")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "a table"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)
