"""``fencegate jobs ...``: the work queue from a shell."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

import asyncpg

from . import formats, jobs_find, periodic_cli, sql
from .cli import emit, run_with_pool
from .client import LeaseClient
from .queue import NewJob, Queue, job_view

_COLUMNS = ("id", "state", "attempts", "max_attempts", "priority", "run_at", "ordering_key",
            "dedupe_key", "last_error")


def table(rows: list[dict[str, Any]], columns: tuple[str, ...] = _COLUMNS) -> str:
    """Rows as an aligned text table."""
    if not rows:
        return "(none)"

    def cell(v: Any) -> str:
        text = formats.text(v)
        return text if len(text) <= 48 else text[:47] + "…"

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _progress(total: int) -> None:
    print(f"\rreplayed {total} jobs", end="", file=sys.stderr, flush=True)


async def _run(args: argparse.Namespace, pool: asyncpg.Pool) -> int:
    client = LeaseClient(pool=pool)
    verb = args.verb
    if verb == "show":
        row = await pool.fetchrow(sql.query("show_job"), args.id)
        if row is None:
            print(f"no job {args.id}", file=sys.stderr)
            return 1
        job = job_view(row)
        emit(args, job, jobs_find.describe(job))
        return 0
    if verb == "stats":
        rows = await pool.fetch(sql.query("queue_stats"), args.queue)
        data = [dict(r) for r in rows]
        emit(args, {"stats": data}, table(data, ("queue", "state", "jobs")))
        return 0
    q = Queue(client, args.queue)
    if verb == "enqueue":
        try:
            payload = json.loads(args.payload)
        except ValueError:
            print("fencegate: --payload must be JSON", file=sys.stderr)
            return 2
        run_at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=args.delay)
                  if args.delay else None)
        [done] = await q.enqueue_reporting([NewJob(
            payload, dedupe_key=args.dedupe_key, ordering_key=args.ordering_key, run_at=run_at,
            max_attempts=args.max_attempts, priority=args.priority)])
        emit(args, {"id": done.id, "queue": args.queue, "deduplicated": done.deduplicated},
             f"job {done.id} on {args.queue} was already there (dedupe key "
             f"{args.dedupe_key!r}): nothing added" if done.deduplicated
             else f"job {done.id} on {args.queue}")
        return 0
    if verb in ("list", "dead"):
        rows = await q.list("dead" if verb == "dead" else args.state, args.limit)
        emit(args, rows, table(rows))
        return 0
    # replay
    if args.ids:
        return await _replay_named(args, pool, q)
    total = await q.replay(None, progress=None if args.json else _progress)
    if not args.json:
        print(file=sys.stderr)
    emit(args, {"replayed": total}, f"replayed {total} dead jobs on {args.queue}")
    return 0


async def _replay_named(args: argparse.Namespace, pool: asyncpg.Pool, q: Queue) -> int:
    """Replay the jobs named, and say of each one that was not replayed why:
    only a dead job of this queue goes back (a queued one is left as it is)."""
    before = {i: await pool.fetchrow(sql.query("show_job"), i) for i in args.ids}
    total = await q.replay(args.ids)
    after = {i: await pool.fetchrow(sql.query("show_job"), i) for i in args.ids}
    skipped = {}
    for i in args.ids:
        was, now = before[i], after[i]
        if was is None or now is None:
            skipped[i] = "no such job"
        elif was["queue"] != args.queue:
            skipped[i] = f"it is on queue {was['queue']!r}, not {args.queue!r}"
        elif was["state"] != "dead":
            skipped[i] = f"it is {was['state']}, not dead: nothing to replay"
    lines = [f"replayed {total} of {len(args.ids)} jobs on {args.queue}"]
    lines += [f"  job {i}: not replayed: {why}" for i, why in skipped.items()]
    emit(args, {"replayed": total, "not_replayed": {str(i): why for i, why in skipped.items()}},
         "\n".join(lines))
    return 0 if not skipped else 1


def _main(args: argparse.Namespace) -> int:
    return run_with_pool(lambda pool: _run(args, pool))


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = sub.add_parser("jobs", help="work queue: enqueue, list, show, stats, dead, replay")
    verbs = jobs.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("enqueue", help="add a job")
    p.add_argument("queue", help="the queue's name")
    p.add_argument("--payload", default="{}", help="JSON")
    p.add_argument("--dedupe-key", help="enqueue once per key: a repeat returns the first "
                   "job's id and adds nothing")
    p.add_argument("--ordering-key", help="jobs sharing it run one at a time, in "
                   "enqueue order")
    p.add_argument("--delay", type=float, help="seconds until it may run")
    p.add_argument("--max-attempts", type=int, help="runs before the job is dead "
                   "(default 5)")
    p.add_argument("--priority", type=int, default=0,
                   help="higher runs first (default 0)")
    p = verbs.add_parser("list", help="a queue's jobs")
    p.add_argument("queue", help="the queue's name")
    p.add_argument("--state", choices=["queued", "claimed", "completed", "dead"],
                   help="only jobs in this state")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p = verbs.add_parser("dead", help="a queue's dead jobs, with their last error")
    p.add_argument("queue", help="the queue's name")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p = verbs.add_parser("show", help="one job")
    p.add_argument("id", type=int, help="the job's id")
    p = verbs.add_parser("stats", help="depth by state")
    p.add_argument("queue", nargs="?", help="one queue (default: every queue)")
    p = verbs.add_parser("replay", help="dead jobs back to the queue, attempts reset")
    p.add_argument("queue", help="the queue's name")
    p.add_argument("ids", type=int, nargs="*", help="job ids (default: every dead job)")
    for v in verbs.choices.values():
        v.add_argument("--json", action="store_true", help="print JSON")
        v.set_defaults(func=_main)
    jobs_find.add_verbs(verbs, table)
    periodic_cli.add_verbs(verbs)
