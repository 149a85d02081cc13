"""``fencegate jobs find`` (filters, keyset pages) and what ``jobs show`` prints."""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import asyncpg

from . import formats, search
from .cli import emit, run_with_pool
from .client import LeaseClient

DEFAULT_LIMIT = 50
#: the last error's lines, indented under their label
ERROR_WIDTH = 88
FIND_COLUMNS = ("id", "queue", "state", "attempts", "max_attempts", "run_at", "dedupe_key",
                "ordering_key", "last_error")


def describe(job: dict[str, Any]) -> str:
    """One job as a person reads it: what it is, where it stands, its attempts
    and its last error whole (wrapped, indented under its label)."""
    attempts = f"{job['attempts']} of {job['max_attempts']}"
    if job["state"] == "queued" and job["attempts"]:
        attempts += ", retrying"
    lines = [f"job {job['id']} on {job['queue']}: {job['state']}",
             f"{'attempts':>13}: {attempts}"]
    for name in ("priority", "dedupe_key", "ordering_key", "created_at", "run_at",
                 "claimed_by", "claimed_at", "fence", "finished_at", "result_ref"):
        if job.get(name) is not None:
            lines.append(f"{name:>13}: {formats.text(job[name])}")
    lines.append(f"{'payload':>13}: {formats.text(job['payload'])}")
    error = job.get("last_error")
    if error:
        lines.append(f"{'last error':>13}:")
        # stored on one line (leases/retry.py): wrapped to be read, words kept
        lines += textwrap.wrap(str(error), width=ERROR_WIDTH, initial_indent=" " * 15,
                               subsequent_indent=" " * 15, break_on_hyphens=False)
    elif job["attempts"]:
        lines.append(f"{'last error':>13}: (none)")
    return "\n".join(lines)


def _filter(args: argparse.Namespace, now: Any) -> search.JobFilter:
    states = tuple(s.strip() for part in args.state for s in part.split(",") if s.strip()) \
        if args.state else None
    return search.JobFilter(
        states=states, queue=args.queue, dedupe_key=args.dedupe_key,
        ordering_key=args.ordering_key, key=args.key,
        payload=tuple(search.parse_payload(p) for p in args.payload or ()),
        since=search.parse_time(args.since, now) if args.since else None,
        until=search.parse_time(args.until, now) if args.until else None,
        time_field=args.time)


def _next_command(args: argparse.Namespace, after: int) -> str:
    """The command that prints the next page: this one's filters, and ``--after``."""
    words = ["fencegate", "jobs", "find", *([args.queue] if args.queue else [])]
    for flag, values in (("--state", args.state), ("--payload", args.payload)):
        for v in values or ():
            words += [flag, v]
    for flag, value in (("--dedupe-key", args.dedupe_key), ("--ordering-key", args.ordering_key),
                        ("--key", args.key), ("--since", args.since), ("--until", args.until)):
        if value is not None:
            words += [flag, value]
    if args.time != "created":
        words += ["--time", args.time]
    if args.limit != DEFAULT_LIMIT:
        words += ["--limit", str(args.limit)]
    return shlex.join([*words, "--after", str(after)])


async def _find(args: argparse.Namespace, pool: asyncpg.Pool) -> int:
    client = LeaseClient(pool=pool)
    now = await client.fetchval("database_now")
    try:
        page = await search.find_jobs(client, _filter(args, now), after=args.after,
                                      limit=args.limit)
    except search.BadFilter as exc:
        print(f"fencegate: jobs find: {exc}", file=sys.stderr)
        return 2
    text = args.table(page.jobs, FIND_COLUMNS) if page.jobs else "no jobs match"
    if page.after is not None:
        text += f"\nmore: {_next_command(args, page.after)}"
    emit(args, {"jobs": page.jobs, "after": page.after}, text)
    return 0


def _main(args: argparse.Namespace) -> int:
    return run_with_pool(lambda pool: _find(args, pool))


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser],
              table: Callable[[list[dict[str, Any]], tuple[str, ...]], str]) -> None:
    """Add ``find`` to ``fencegate jobs``; ``table`` draws rows as the other
    jobs verbs do."""
    p = verbs.add_parser("find", help="jobs by state, queue, key, payload field and time",
                         description="Jobs matching every filter given, newest first, a page "
                         "at a time (--after: the id the page before printed).")
    p.add_argument("queue", nargs="?", help="one queue (default: every queue)")
    p.add_argument("--state", action="append", help="only jobs in this state (repeat, or "
                   "comma-separate, for several; `scheduled`: queued, not yet due)")
    p.add_argument("--dedupe-key", help="the job with this dedupe key")
    p.add_argument("--ordering-key", help="jobs with this ordering key")
    p.add_argument("--key", help="jobs whose dedupe key or ordering key is this")
    p.add_argument("--payload", action="append", metavar="PATH=VALUE",
                   help="the payload field at PATH (dots between names: customer.id) "
                   "equals VALUE (JSON: 42, true, \"42\"; else a string); repeat for several")
    p.add_argument("--since", help="from this time on (RFC 3339, or an age: 15m, 2h, 7d)")
    p.add_argument("--until", help="before this time (RFC 3339, or an age)")
    p.add_argument("--time", choices=search.TIME_FIELDS, default="created",
                   help="the time --since and --until are about (default: created)")
    p.add_argument("--after", type=int, help="the page after the one that ended at this id")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help=f"at most this many (default {DEFAULT_LIMIT})")
    p.add_argument("--json", action="store_true",
                   help="print JSON: {\"jobs\": [...], \"after\": next page's --after or null}")
    p.set_defaults(func=_main, table=table)
