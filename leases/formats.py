"""One way to write a time, everywhere fencegate shows one: the command line
(text and ``--json``), the gateway's JSON answers, the console and the logs.

RFC 3339 in UTC with milliseconds: ``2025-11-30T09:18:04.123Z``. Sorted as
text, these sort in time order.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any


def timestamp(value: dt.datetime) -> str:
    """``value`` as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (UTC; a naive time is taken as UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def jsonable(value: object) -> object:
    """``json.dumps(default=...)``: times as ``timestamp``; anything else is an error."""
    if isinstance(value, dt.datetime):
        return timestamp(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def to_json(data: Any) -> str:
    return json.dumps(data, default=jsonable, sort_keys=True)


def text(value: object) -> str:
    """A value as a person reads it: times as ``timestamp``, structures as JSON,
    nothing as an empty string."""
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return timestamp(value)
    if isinstance(value, dict | list):
        return json.dumps(value, default=jsonable, sort_keys=True)
    return str(value)
