"""What each console screen shows, read from the database through the
``leases`` package's named statements (leases/sql/*.sql).

Reads are cheap by construction: each screen is a few statements, each bounded
(a LIMIT, a partial index, a time window), and one process reads a screen at
most once per ``FRESH_SECONDS`` however many operators watch it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from gateway.console.jobs import find_jobs
from gateway.effects import fingerprint
from gateway.ledger import RESOLVE_GRACE_SECONDS
from gateway.wire import FENCE_REFUSALS, EffectState
from leases import Database, search
from leases.redact import redact

#: a screen's data is shared by every viewer of one process for this long
FRESH_SECONDS = 1.0
#: how far back the screens look
RECENT_LEASES_SECONDS = 3600.0
EFFECT_COUNTS_SECONDS = 3600.0
REJECTIONS_SECONDS = 3600.0
ROWS = 50
#: the most rows a page may ask for (``per``), and the deepest page
MAX_PER_PAGE = 200
MAX_PAGE = 1000
#: a process keeps at most this many filtered views
MAX_CACHED = 200
#: the effect states, in the order the console lists them
EFFECT_STATES: tuple[EffectState, ...] = ("succeeded", "failed", "unknown", "in_flight")
JOB_STATES = ("queued", "claimed", "completed", "dead", "cancelled")
REASONS = tuple(sorted(FENCE_REFUSALS))
#: a worker acting under a lease it held once and lost; the other reasons
#: (no_lease, invalid_fence) are fences no claim issued: a bug or a forgery
ZOMBIE_REASONS = ("lease_expired", "stale_fence")


@dataclass
class Cache:
    """Each screen's data, read once per ``FRESH_SECONDS`` per process."""

    entries: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def get(self, name: str, read: Callable[[], Awaitable[dict[str, Any]]],
                  ) -> dict[str, Any]:
        lock = self.locks.setdefault(name, asyncio.Lock())
        async with lock:  # viewers arriving together share one read
            found = self.entries.get(name)
            if found is not None and time.monotonic() - found[0] < FRESH_SECONDS:
                return found[1]
            data = await read()
            if len(self.entries) >= MAX_CACHED:
                self.entries.clear()
            self.entries[name] = (time.monotonic(), data)
            return data

    def forget(self) -> None:
        """After an action: the next view reads afresh."""
        self.entries.clear()


def _rows(records: list[Any]) -> list[dict[str, Any]]:
    return [dict(r) for r in records]


# ---- filters and pages, from a screen's query string ----------------------------------

class BadFilter(ValueError):
    """A filter that cannot be read: the page says which and why (400)."""


def _text(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name, "").strip()
    if len(value) > 255:
        raise BadFilter(f"{name}: at most 255 characters")
    return value or None


def _choice(query: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    value = _text(query, name)
    if value is not None and value not in allowed:
        raise BadFilter(f"{name}: one of {', '.join(allowed)}")
    return value


def _time(query: Mapping[str, str], name: str) -> dt.datetime | None:
    value = _text(query, name)
    if value is None:
        return None
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        raise BadFilter(f"{name}: a time like 2025-11-30T09:18:04Z (UTC, RFC 3339)") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)


def _int(query: Mapping[str, str], name: str, default: int, top: int) -> int:
    value = _text(query, name)
    if value is None:
        return default
    if not value.isdigit() or not 1 <= int(value) <= top:
        raise BadFilter(f"{name}: a whole number from 1 to {top}")
    return int(value)


def _paged(query: Mapping[str, str], path: str, rows: list[dict[str, Any]], page: int,
           per: int) -> dict[str, Any]:
    """The page's rows (one more was read, to know whether a next page
    exists) and links to the pages before and after, filters kept."""
    kept = {k: v for k, v in query.items() if k not in ("page", "notice", "part") and v}

    def link(n: int) -> str:
        return f"{path}?{urlencode({**kept, 'page': n})}" if n > 1 or kept else path

    return {"rows": rows[:per], "page": page,
            "newer": link(page - 1) if page > 1 else None,
            "older": link(page + 1) if len(rows) > per else None}


def _page(query: Mapping[str, str]) -> tuple[int, int]:
    return _int(query, "page", 1, MAX_PAGE), _int(query, "per", ROWS, MAX_PER_PAGE)


async def leases(db: Database, query: Mapping[str, str]) -> dict[str, Any]:
    status = _choice(query, "status", ("live", "ended"))
    resource = _text(query, "resource")
    page, per = _page(query)
    filtered = bool(status or resource or "page" in query or "per" in query)
    if filtered:
        rows = _rows(await db.fetch("search_leases", resource, status, per + 1,
                                    (page - 1) * per))
    else:
        rows = _rows(await db.fetch("recent_leases", per + 1, RECENT_LEASES_SECONDS))
    paged = _paged(query, "/console/leases", rows, page, per)
    rows = paged["rows"]
    open_ = _rows(await db.fetch("open_effects", ROWS, RESOLVE_GRACE_SECONDS))
    holding: dict[str, list[dict[str, Any]]] = {}
    for e in open_:
        if e["state"] == "in_flight":
            holding.setdefault(e["resource"], []).append(e)
    for row in rows:
        row["holding"] = holding.get(row["resource"], [])
    return {"leases": rows, "live": sum(1 for r in rows if r["live"]),
            "draining": sum(1 for r in rows if r["draining"]), "pager": paged,
            "filtered": filtered, "filters": {"status": status or "", "resource": resource or ""},
            "window_minutes": int(RECENT_LEASES_SECONDS // 60)}


async def effects(db: Database, query: Mapping[str, str]) -> dict[str, Any]:
    filters = {"key": _text(query, "key"), "resource": _text(query, "resource"),
               "state": _choice(query, "state", EFFECT_STATES),
               "provider": _text(query, "provider"),
               "since": _time(query, "since"), "until": _time(query, "until")}
    page, per = _page(query)
    found = _rows(await db.fetch(
        "search_effects", filters["key"], filters["resource"], filters["state"],
        filters["provider"], filters["since"], filters["until"], per + 1, (page - 1) * per,
        RESOLVE_GRACE_SECONDS))
    paged = _paged(query, "/console/effects", found, page, per)
    counts = {r["state"]: r["effects"]
              for r in await db.fetch("effect_counts", EFFECT_COUNTS_SECONDS)}
    open_ = _rows(await db.fetch("open_effects", ROWS, RESOLVE_GRACE_SECONDS))
    recent = _rows(await db.fetch("recent_effects", ROWS))
    resolved = _rows(await db.fetch("recent_resolutions", ROWS))
    for e in (*open_, *recent, *resolved, *paged["rows"]):
        e["summary"] = redact(e["summary"])
    return {"counts": {s: counts.get(s, 0) for s in ("succeeded", "failed", "unknown",
                                                      "in_flight")},
            "unknown": [e for e in open_ if e["state"] == "unknown"],
            "in_flight": [e for e in open_ if e["state"] == "in_flight"],
            "recent": recent, "resolved": resolved, "found": paged["rows"], "pager": paged,
            "filters": {k: query.get(k, "") for k in filters}, "states": EFFECT_STATES,
            "window_minutes": int(EFFECT_COUNTS_SECONDS // 60)}


async def effect(db: Database, client: str, key: str) -> dict[str, Any]:
    """One effect's page: its ledger row (None once gone), its resolutions, the
    current lease row of its resource and the rejections recorded on it. A
    client or key holding a NUL names no effect (PostgreSQL text holds none)."""
    if "\x00" in client or "\x00" in key:
        return {"client": client, "key": key, "e": None, "resolutions": [],
                "resource": None, "lease": None, "rejections": []}
    row = await db.fetchrow("effect_detail", client, key, RESOLVE_GRACE_SECONDS)
    e = dict(row) if row is not None else None
    resolutions = _rows(await db.fetch("effect_resolutions", client, key))
    for r in resolutions:
        r["summary"] = redact(r["summary"])
    resource = e["resource"] if e else resolutions[0]["resource"] if resolutions else None
    if e is not None:
        brief = _decoded(e.pop("request_summary"))
        e["request_kind"] = brief.get("kind") if isinstance(brief, dict) else None
        e["request"] = request_rows(brief, client, key)
        e["summary"] = redact(e["summary"])
        e["response_headers"] = redact(_decoded(e["response_headers"]))
        body = e["response_body"]
        e["response_body"] = redact(_body_text(body)) if body else None
    lease = await db.fetchrow("show_lease", resource) if resource else None
    return {"client": client, "key": key, "e": e, "resolutions": resolutions,
            "resource": resource, "lease": dict(lease) if lease else None,
            "rejections": _rows(await db.fetch("resource_rejections", resource, ROWS))
            if resource else []}


def request_rows(summary: Any, client: str, key: str) -> list[tuple[str, str]]:
    """The request as sent (effects/summary.py), as the effect page's rows:
    (what, value) pairs; none for an effect admitted without a summary. The
    summary was redacted when it was built; its strings are redacted again
    here, as everything a caller wrote is on the way to the page."""
    if not isinstance(summary, dict):
        return []
    s = redact(summary)

    def listed(name: str) -> str:
        items = [str(i) for i in s.get(name) or []]
        more = s.get(f"{name}_omitted")
        return ", ".join(items) + (f" and {more} more" if more else "") if items else ""

    def size(name: str) -> str:
        return _bytes(s.get(name))

    if s.get("kind") == "email":
        files = [f"{a.get('name')} ({a.get('content_type')}, {_bytes(a.get('bytes'))})"
                 for a in s.get("attachments") or [] if isinstance(a, dict)]
        more = s.get("attachments_omitted")
        rows = [("from", s.get("from") or ""), ("to", listed("to")), ("cc", listed("cc")),
                ("bcc", listed("bcc")), ("reply-to", s.get("reply_to") or ""),
                ("subject", s.get("subject") or ""),
                ("Message-ID", fingerprint.message_id(client, key)),
                ("its own headers (names)", listed("headers")),
                ("attachments", ", ".join(files) + (f" and {more} more" if more else "")),
                ("text", size("text_bytes")), ("HTML", size("html_bytes")),
                ("whole message", size("message_bytes"))]
    else:
        rows = [("method, path", f"{s.get('method', '')} {s.get('path', '')}"),
                ("forwarded headers (names)", listed("headers")),
                ("body", size("body_bytes")), ("content type", s.get("content_type") or "")]
    return [(what, value) for what, value in rows if value]


def _bytes(n: Any) -> str:
    return f"{n:,} bytes" if isinstance(n, int) else ""


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _body_text(body: bytes) -> Any:
    """A stored answer's body as the page shows it: decoded JSON (so its
    secret-looking fields are blanked by name), else text."""
    text = body.decode("utf-8", "replace")
    try:
        return json.dumps(redact(json.loads(text)), sort_keys=True)
    except ValueError:
        return text


async def rejections(db: Database, query: Mapping[str, str]) -> dict[str, Any]:
    by_minute = await db.fetch("rejections_by_minute", REJECTIONS_SECONDS)
    resources = _rows(await db.fetch("rejected_resources", REJECTIONS_SECONDS, ROWS,
                                     list(ZOMBIE_REASONS)))
    others = _rows(await db.fetch("rejected_resources", REJECTIONS_SECONDS, ROWS,
                                  [r for r in REASONS if r not in ZOMBIE_REASONS]))
    totals: dict[tuple[str, str], int] = {}
    for r in by_minute:
        key = (r["provider"], r["reason"])
        totals[key] = totals.get(key, 0) + r["rejections"]
    return {"chart": chart(by_minute, time.time()),
            "totals": [{"provider": p, "reason": why, "rejections": n}
                       for (p, why), n in sorted(totals.items())],
            "total": sum(totals.values()), "resources": resources, "others": others,
            "window_minutes": int(REJECTIONS_SECONDS // 60)}


async def queues(db: Database, query: Mapping[str, str]) -> dict[str, Any]:
    depths: dict[str, dict[str, int]] = {}
    for r in await db.fetch("queue_depths"):
        if r["state"] == "paused":  # the queue's own state, not its jobs'
            continue
        depths.setdefault(r["queue"], {})[r["state"]] = r["jobs"]
    oldest = {r["queue"]: dict(r) for r in await db.fetch("oldest_runnable_jobs")}
    try:
        found = await find_jobs(db, query)
    except search.BadFilter as e:
        raise BadFilter(str(e).rstrip(".")) from None
    jobs = found["rows"]
    for job in jobs:
        job["payload"] = redact(job["payload"])
        job["last_error"] = redact(job["last_error"])
    names = sorted(set(depths) | set(oldest))
    return {"queues": [{"name": q, "depth": {s: depths.get(q, {}).get(s, 0)
                                             for s in ("queued", "scheduled", "claimed",
                                                       "dead")},
                        "oldest": oldest.get(q)} for q in names],
            "jobs": jobs, "pager": found["pager"], "states": found["states"],
            "filters": found["filters"]}


# ---- the rejections chart, drawn on the server --------------------------------------

CHART_MINUTES = int(REJECTIONS_SECONDS // 60)
CHART_WIDTH, CHART_HEIGHT, BAR_GAP = 720, 140, 2


def chart(by_minute: list[Any], now: float) -> dict[str, Any]:
    """Bars of the last hour, one per minute, stacked by reason: SVG rectangles
    as data (x, y, width, height, reason, label), so the page needs no script
    and no inline style to draw them. Pure: ``now`` is given."""
    end = int(now // 60) * 60
    start = end - (CHART_MINUTES - 1) * 60
    per: dict[int, dict[str, int]] = {}
    for r in by_minute:
        minute = int(r["minute"].timestamp())
        if start <= minute <= end:
            slot = per.setdefault(minute, {})
            slot[r["reason"]] = slot.get(r["reason"], 0) + r["rejections"]
    peak = max((sum(v.values()) for v in per.values()), default=0)
    width = CHART_WIDTH / CHART_MINUTES
    bars = []
    for minute, counts in sorted(per.items()):
        x = (minute - start) / 60 * width
        y = float(CHART_HEIGHT)
        for reason in REASONS:
            n = counts.get(reason, 0)
            if not n:
                continue
            h = CHART_HEIGHT * n / peak
            y -= h
            at = dt.datetime.fromtimestamp(minute, dt.UTC).strftime("%H:%M")
            bars.append({"x": round(x, 1), "y": round(y, 1), "width": round(width - BAR_GAP, 1),
                         "height": round(h, 1), "reason": reason,
                         "label": f"{at} UTC: {n} {reason}"})
    return {"bars": bars, "peak": peak, "width": CHART_WIDTH, "height": CHART_HEIGHT,
            "start": dt.datetime.fromtimestamp(start, dt.UTC).strftime("%H:%M"),
            "end": dt.datetime.fromtimestamp(end, dt.UTC).strftime("%H:%M"),
            "reasons": REASONS}
