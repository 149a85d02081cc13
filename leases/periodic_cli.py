"""``fencegate jobs periodic FILE``: a scheduler process for the schedules a
TOML file declares (``[[schedules]]``), for workers that are not Python or
that declare their schedules as configuration rather than code."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tomllib
from pathlib import Path
from typing import Any

import asyncpg

from .cli import run_with_pool
from .client import LeaseClient
from .errors import InvalidArgument
from .periodic import Schedule, Scheduler, Tick, tick_key

#: the keys a ``[[schedules]]`` table may hold: Schedule's fields
KEYS = {"name": str, "cron": str, "queue": str, "payload": object, "priority": int,
        "max_attempts": int, "ordering_key": str, "timezone": str, "catch_up": float}
REQUIRED = ("name", "cron", "queue")


def schedules_from_toml(text: str, source: str) -> list[Schedule]:
    """The ``[[schedules]]`` of a TOML file; an ``InvalidArgument`` naming the
    file, the table and the key for anything wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{source}: not TOML: {exc}") from None
    tables = data.get("schedules")
    if not isinstance(tables, list) or not tables:
        raise InvalidArgument(f"{source}: no [[schedules]] table")
    found = []
    for n, table in enumerate(tables, 1):
        where = f"{source}, schedule {n}"
        unknown = sorted(set(table) - set(KEYS))
        if unknown:
            raise InvalidArgument(f"{where}: unknown key {unknown[0]!r} (keys: "
                                  f"{', '.join(KEYS)})")
        for key in REQUIRED:
            if key not in table:
                raise InvalidArgument(f"{where}: {key} is missing")
        for key, value in table.items():
            kind = KEYS[key]
            wrong = ((kind is float and (not isinstance(value, int | float)
                                        or isinstance(value, bool)))
                     or (kind in (str, int) and (type(value) is not kind)))
            if wrong:
                raise InvalidArgument(f"{where}: {key} must be "
                                      f"{'a number' if kind is float else kind.__name__}")
        fields: dict[str, Any] = dict(table)
        try:
            found.append(Schedule(**fields))
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}: {exc}") from None
    return found


def _said(tick: Tick) -> None:
    if tick.enqueued:  # a duplicate is another scheduler's: said there
        print(f"enqueued {tick_key(tick.schedule, tick.tick)} as job {tick.job_id}",
              flush=True)


async def _run(schedules: list[Schedule], pool: asyncpg.Pool) -> int:
    scheduler = Scheduler(LeaseClient(pool=pool), schedules, on_tick=_said)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, scheduler.stop)
    print(f"fencegate: periodic: {len(schedules)} schedule(s): "
          + ", ".join(f"{s.name} ({s.cron!r} on {s.queue})" for s in schedules),
          file=sys.stderr, flush=True)
    await scheduler.run()
    return 0


def _main(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        schedules = schedules_from_toml(path.read_text(), str(path))
    except OSError as exc:
        print(f"fencegate: {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except InvalidArgument as exc:
        print(f"fencegate: {exc}", file=sys.stderr)
        return 2
    return run_with_pool(lambda pool: _run(schedules, pool))


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``periodic`` to ``fencegate jobs``."""
    p = verbs.add_parser("periodic", help="run a scheduler for the schedules a TOML "
                         "file declares, until SIGTERM",
                         description="Enqueue each tick of the [[schedules]] in FILE "
                         "once, however many of these (or Python Schedulers) run.")
    p.add_argument("file", help="TOML with [[schedules]] tables: name, cron, queue, and "
                   "optionally payload, priority, max_attempts, ordering_key, timezone, "
                   "catch_up")
    p.set_defaults(func=_main)
