"""The jobs table of the queues screen: ``leases.search`` filters read from
the query string, a keyset page, and the links to the next one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from leases import Database, search
from leases.redact import secret_name

#: jobs per page, and the most a page may ask for
PER_PAGE = 50
MAX_PER_PAGE = 200
#: the state the table shows when none is asked for: what needs an operator
DEFAULT_STATE = "dead"
ANY = "any"
#: the query's names for the filters, as the form sends them
FIELDS = ("state", "queue", "key", "payload", "since", "until")
PATH = "/console/queues"


def _text(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name, "").strip()
    if len(value) > search.MAX_KEY_LENGTH:
        raise search.BadFilter(f"{name}: at most {search.MAX_KEY_LENGTH} characters")
    return value or None


def _whole(query: Mapping[str, str], name: str, default: int | None, top: int) -> int | None:
    value = _text(query, name)
    if value is None:
        return default
    if not value.isdigit() or not 1 <= int(value) <= top:
        raise search.BadFilter(f"{name}: a whole number from 1 to {top}")
    return int(value)


async def find_jobs(db: Database, query: Mapping[str, str]) -> dict[str, Any]:
    """The page of jobs ``query`` asks for (``state``, ``queue``, ``key``,
    ``payload`` as ``PATH=VALUE``, ``since``, ``until``, ``after``, ``per``).

    Raises:
        leases.search.BadFilter: a filter that cannot be read, said why.
    """
    states = await search.known_states(db)
    state = _text(query, "state") or DEFAULT_STATE
    if state != ANY and state not in states:
        raise search.BadFilter(f"state: one of {', '.join((*states, ANY))}")
    payload = _text(query, "payload")
    condition = search.parse_payload(payload) if payload else None
    if condition is not None and any(secret_name(p) for p in condition.path):
        # the console blanks these fields: a filter would let them be guessed
        raise search.BadFilter(f"payload: {'.'.join(condition.path)} looks like a secret, "
                               "which the console does not search")
    since, until = _text(query, "since"), _text(query, "until")
    # ages are counted back from the database's clock, as every time is
    now: dt.datetime = await db.fetchval("database_now") if since or until else dt.datetime.now(
        dt.UTC)
    where = search.JobFilter(
        states=None if state == ANY else (state,), queue=_text(query, "queue"),
        key=_text(query, "key"),
        payload=(condition,) if condition is not None else (),
        since=search.parse_time(since, now) if since else None,
        until=search.parse_time(until, now) if until else None)
    per = _whole(query, "per", PER_PAGE, MAX_PER_PAGE) or PER_PAGE
    after = _whole(query, "after", None, 2**63 - 1)
    page = await search.find_jobs(db, where, after=after, limit=per)
    kept = {k: query[k] for k in (*FIELDS, "per") if query.get(k)}
    return {
        "rows": page.jobs,
        "pager": {"newer": f"{PATH}?{urlencode(kept)}" if after else None,
                  "older": f"{PATH}?{urlencode({**kept, 'after': page.after})}"
                  if page.after is not None else None},
        "states": (*states, ANY),
        "filters": {"state": state, **{k: query.get(k, "").strip() for k in FIELDS[1:]}},
    }
