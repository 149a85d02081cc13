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
from .errors import InvalidArgument
from .queue import NewJob, Queue, check_queue, job_view

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
        if args.queue is not None:
            check_queue(args.queue)
        rows = await pool.fetch(sql.query("queue_stats"), args.queue)
        data = [dict(r) for r in rows]
        emit(args, {"stats": data}, table(data, ("queue", "state", "jobs")))
        return 0
    if verb == "queues":
        rows = [dict(r) for r in await pool.fetch(sql.query("list_queues"), None)]
        for r in rows:
            r["state"] = "paused" if r["paused_at"] is not None else "running"
        emit(args, {"queues": rows}, table(rows, ("queue", "state", "paused_at")))
        return 0
    q = Queue(client, args.queue)
    if verb in ("cancel", "pause", "resume"):
        return await _control(args, q)
    if verb == "enqueue":
        return await _enqueue(args, q)
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


async def _enqueue(args: argparse.Namespace, q: Queue) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError:
        print("fencegate: --payload must be JSON", file=sys.stderr)
        return 2
    try:
        run_at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=args.delay)
                  if args.delay else None)
    except (OverflowError, ValueError):  # nan, inf, or past the year 9999
        print("fencegate: --delay must be a number of seconds that ends before the "
              "year 9999", file=sys.stderr)
        return 2
    try:
        [done] = await q.enqueue_reporting([NewJob(
            payload, dedupe_key=args.dedupe_key, ordering_key=args.ordering_key,
            run_at=run_at, max_attempts=args.max_attempts, priority=args.priority,
            unique_key=args.unique_key, unique_for=args.unique_for)])
    except InvalidArgument as exc:
        print(f"fencegate: {exc}", file=sys.stderr)
        return 2
    key = (f"dedupe key {args.dedupe_key!r}" if args.dedupe_key
           else f"unique key {args.unique_key!r}")
    emit(args, {"id": done.id, "queue": q.name, "deduplicated": done.deduplicated},
         f"job {done.id} on {q.name} was already there ({key}): nothing added"
         if done.deduplicated else f"job {done.id} on {q.name}")
    return 0


async def _control(args: argparse.Namespace, q: Queue) -> int:
    """cancel, pause, resume: what was done, and of each job not cancelled why."""
    if args.verb == "pause":
        since = await q.pause()
        emit(args, {"queue": q.name, "paused_at": since},
             f"queue {q.name} paused (since {formats.text(since)}): no job is claimed "
             f"until `fencegate jobs resume {q.name}`; jobs running finish")
        return 0
    if args.verb == "resume":
        was = await q.resume()
        emit(args, {"queue": q.name, "resumed": was},
             f"queue {q.name} resumed" if was else f"queue {q.name} was not paused")
        return 0
    done = await q.cancel_many(args.ids)
    lines = []
    for c in done:
        if c.cancelled:
            lines.append(f"job {c.id}: cancelled (it was {c.was}"
                         + ("; its lease ended, its worker stops it" if c.was == "claimed"
                            else "") + ")")
        elif c.was == "missing":
            lines.append(f"job {c.id}: not cancelled: no such job on queue {q.name!r}")
        else:
            lines.append(f"job {c.id}: not cancelled: it is {c.was} already")
    emit(args, {"cancelled": [c.id for c in done if c.cancelled],
                "not_cancelled": {str(c.id): c.was for c in done if not c.cancelled},
                "was": {str(c.id): c.was for c in done}}, "\n".join(lines))
    return 0 if all(c.cancelled for c in done) else 1


def _main(args: argparse.Namespace) -> int:
    return run_with_pool(lambda pool: _run(args, pool))


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = sub.add_parser("jobs", help="work queue: enqueue, list, show, stats, dead, replay, "
                          "cancel, pause, resume, queues")
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
    p.add_argument("--unique-key", help="at most one job holds the key: while it is not "
                   "finished, or with --unique-for for a window; a repeat meanwhile returns "
                   "the holder's id and adds nothing")
    p.add_argument("--unique-for", type=float, metavar="SECONDS",
                   help="the window of --unique-key (aligned on the epoch)")
    p = verbs.add_parser("list", help="a queue's jobs")
    p.add_argument("queue", help="the queue's name")
    p.add_argument("--state", choices=["queued", "claimed", "completed", "dead", "cancelled"],
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
    p = verbs.add_parser("cancel", help="cancel jobs: a queued one never runs, a running "
                         "one's lease ends and its handler is stopped; final (no replay)")
    p.add_argument("queue", help="the queue's name")
    p.add_argument("ids", type=int, nargs="+", help="job ids")
    p = verbs.add_parser("pause", help="stop claiming from a queue (running jobs finish)")
    p.add_argument("queue", help="the queue's name")
    p = verbs.add_parser("resume", help="claim from a paused queue again")
    p.add_argument("queue", help="the queue's name")
    verbs.add_parser("queues", help="every queue, running or paused")
    for v in verbs.choices.values():
        v.add_argument("--json", action="store_true", help="print JSON")
        v.set_defaults(func=_main)
    jobs_find.add_verbs(verbs, table)
    periodic_cli.add_verbs(verbs)
