"""Finding jobs: by state, queue, key, payload field and time, keyset paged.

The filters are read and checked here (``JobFilter``, ``parse_payload``,
``parse_time``), pure, so the command line and the console refuse the same bad
input with the same words (``BadFilter``); the one statement they run is
``find_jobs`` in leases/sql/search.sql, every value a parameter.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import asyncpg

from .errors import InvalidArgument
from .queue import QUEUE_PATTERN

#: the most jobs one page holds
MAX_LIMIT = 1000
MAX_KEY_LENGTH = 255
MAX_PAYLOAD_CONDITIONS = 16
MAX_PATH_DEPTH = 16
#: what the time range may be about
TimeField = Literal["created", "run_at", "finished"]
TIME_FIELDS: tuple[TimeField, ...] = ("created", "run_at", "finished")
#: a state of no column: a queued job not yet due
SCHEDULED = "scheduled"
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_CHECKED_STATE = re.compile(r"'([a-z_]+)'::text")


class BadFilter(InvalidArgument):
    """A filter that cannot be read; the message says which and why."""


class Reader(Protocol):
    async def fetch(self, name: str, *args: Any) -> list[asyncpg.Record]: ...


@dataclass(frozen=True)
class PayloadCondition:
    """``payload #> path = value``: the payload field at ``path`` equals ``value``."""

    path: tuple[str, ...]
    value: Any


@dataclass(frozen=True)
class JobFilter:
    """What to find; every field left None matches any job."""

    states: tuple[str, ...] | None = None
    queue: str | None = None
    dedupe_key: str | None = None
    ordering_key: str | None = None
    #: either key
    key: str | None = None
    payload: tuple[PayloadCondition, ...] = ()
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    time_field: TimeField = "created"

    def __post_init__(self) -> None:
        if self.queue is not None and not QUEUE_PATTERN.fullmatch(self.queue):
            raise BadFilter(f"queue {self.queue!r}: queue names are 1 to 100 of "
                            "A-Z a-z 0-9 . _ -")
        for name in ("dedupe_key", "ordering_key", "key"):
            value = getattr(self, name)
            if value is not None and not 1 <= len(value) <= MAX_KEY_LENGTH:
                raise BadFilter(f"{name.replace('_', ' ')}: 1 to {MAX_KEY_LENGTH} characters")
        if len(self.payload) > MAX_PAYLOAD_CONDITIONS:
            raise BadFilter(f"at most {MAX_PAYLOAD_CONDITIONS} payload conditions")
        if self.time_field not in TIME_FIELDS:
            raise BadFilter(f"time field {self.time_field!r}: one of {', '.join(TIME_FIELDS)}")
        for name in ("since", "until"):
            at = getattr(self, name)
            if at is not None and at.tzinfo is None:
                raise BadFilter(f"{name}: a time with its time zone")
        if self.since and self.until and self.since >= self.until:
            raise BadFilter("since must be before until")
        if self.states is not None and not self.states:
            raise BadFilter("states: name at least one, or leave them out")


@dataclass
class Page:
    """One page of jobs, newest first; ``after``: pass it to get the next page
    (None: this was the last)."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    after: int | None = None


def parse_payload(text: str) -> PayloadCondition:
    """``customer.id=42`` (the value as JSON: 42, "42", true, null; anything
    that is not JSON is taken as a string: ``plan=pro``)."""
    path, eq, raw = text.partition("=")
    if not eq or not path:
        raise BadFilter(f"payload filter {text!r}: write it as FIELD.PATH=VALUE, "
                        "e.g. customer.id=42")
    parts = tuple(path.split("."))
    if any(not p for p in parts) or len(parts) > MAX_PATH_DEPTH:
        raise BadFilter(f"payload filter {text!r}: a path of 1 to {MAX_PATH_DEPTH} names "
                        "joined by dots, none empty")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return PayloadCondition(parts, value)


def parse_time(text: str, now: dt.datetime) -> dt.datetime:
    """An RFC 3339 time (UTC when it names no zone), or an age before ``now``:
    ``90s``, ``15m``, ``2h``, ``7d``."""
    text = text.strip()
    ago = _AGO.fullmatch(text)
    if ago:
        return now - dt.timedelta(seconds=float(ago[1]) * _SECONDS[ago[2]])
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadFilter(f"time {text!r}: a time like 2026-12-02T09:18:04Z, or an age "
                        "like 15m, 2h, 7d") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)


def states_of(definitions: list[str]) -> tuple[str, ...]:
    """The job states the schema's CHECK constraint lists (``schema_job_states``)."""
    found: list[str] = []
    for d in definitions:
        found += [s for s in _CHECKED_STATE.findall(d) if s not in found]
    return tuple(found)


async def known_states(db: Reader) -> tuple[str, ...]:
    """Every state a filter may name: the schema's, and ``scheduled``."""
    rows = await db.fetch("schema_job_states")
    return (*states_of([r["definition"] for r in rows]), SCHEDULED)


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise BadFilter(f"limit: from 1 to {MAX_LIMIT}")
    return limit


async def find_jobs(db: Reader, where: JobFilter, *, after: int | None = None,
                    limit: int = 50) -> Page:
    """The jobs matching ``where``, newest first, at most ``limit``, only
    those older than job ``after`` (the last id of the page before).

    Raises:
        BadFilter: a filter names a state the schema does not know, or a
            limit out of range.
        Unavailable: the database gave no answer.
    """
    check_limit(limit)
    if after is not None and after < 1:
        raise BadFilter("after: a job id (a whole number from 1)")
    if where.states is not None:
        known = await known_states(db)
        unknown = [s for s in where.states if s not in known]
        if unknown:
            raise BadFilter(f"no job state {', '.join(map(repr, unknown))}: the states are "
                            f"{', '.join(known)}")
    conditions = (json.dumps([{"path": list(c.path), "value": c.value} for c in where.payload])
                  if where.payload else None)
    rows = await db.fetch(
        "find_jobs", list(where.states) if where.states is not None else None, where.queue,
        where.dedupe_key, where.ordering_key, where.key, conditions, where.since,
        where.until, where.time_field, after, limit + 1)
    jobs = [dict(r) for r in rows[:limit]]
    for job in jobs:
        job["payload"] = json.loads(job["payload"])
    return Page(jobs, jobs[-1]["id"] if len(rows) > limit else None)
