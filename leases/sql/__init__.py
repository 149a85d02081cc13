"""The named SQL statements of fencegate, one file per table (leases.sql,
effects.sql, jobs.sql, rejections.sql; search.sql reads jobs for finding them
and for periodic ticks), loaded once; the schema they run on is described whole
in ``schema.sql`` and built by the files in ``migrations/``."""

from __future__ import annotations

import functools
import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a file of ``-- name: X`` blocks into ``{name: statement}``."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip().rstrip(";")
    return queries


#: the statement files, one per table
FILES = ("leases.sql", "effects.sql", "jobs.sql", "rejections.sql", "search.sql")


@functools.cache
def _queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for file in FILES:
        for name, text in parse_queries(
                resources.files(__package__).joinpath(file).read_text()).items():
            if name in found:
                raise ValueError(f"query {name!r} is defined twice")
            found[name] = text
    return found


def names() -> frozenset[str]:
    """Every statement's name."""
    return frozenset(_queries())


def query(name: str) -> str:
    """The statement called ``name``."""
    return _queries()[name]


def migrations() -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` of every migration file, in order."""
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        if entry.name.endswith(".sql"):
            version, _, name = entry.name.removesuffix(".sql").partition("_")
            found.append((int(version), name, entry.read_text()))
    found.sort()
    return found
