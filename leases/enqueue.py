"""Enqueue: one statement for a batch, each job deduplicated by its permanent
``dedupe_key`` or by its ``unique_key`` for a window, in the same statement as
the insert (``enqueue_jobs``, leases/sql/jobs.sql), so enqueuers racing with
the same key make one job between them."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from .errors import InvalidArgument
from .metrics import JOBS

if TYPE_CHECKING:
    from .client import LeaseClient

#: a unique key's slot may be found free after the insert found it held (its
#: holder completed, was cancelled, or its window ended meanwhile): the insert
#: is tried again this many times
UNIQUE_RETRIES = 5
#: the shortest unique window: the window's number, the epoch over its
#: length, must fit a bigint (fencegate_unique_slot)
MIN_UNIQUE_FOR = 0.001


@dataclass(frozen=True)
class NewJob:
    """One job to enqueue.

    ``unique_key``: at most one job of this queue holds the key at a time;
    another enqueue with it answers the holder's id and adds nothing. With
    ``unique_for`` (seconds) the key is held by every job enqueued in the
    same window of that length (windows aligned on the epoch, by the
    database clock), whatever its state, cancelled ones excepted; without,
    it is held while the job is not finished (queued, scheduled, claimed, or
    dead awaiting replay), and its completion or cancel frees it."""

    payload: Any
    dedupe_key: str | None = None
    ordering_key: str | None = None
    run_at: dt.datetime | None = None
    max_attempts: int | None = None
    priority: int = 0
    unique_key: str | None = None
    unique_for: float | None = None


@dataclass(frozen=True)
class Enqueued:
    """What an enqueue did: the job's id, and whether it was there already
    (the same dedupe key, or a unique key held), in which case nothing was
    added."""

    id: int
    deduplicated: bool


def check(jobs: Sequence[NewJob]) -> None:
    keys = [j.dedupe_key for j in jobs if j.dedupe_key is not None]
    if len(set(keys)) != len(keys):
        raise InvalidArgument("a batch must not repeat a dedupe_key")
    uniques = [j.unique_key for j in jobs if j.unique_key is not None]
    if len(set(uniques)) != len(uniques):
        raise InvalidArgument("a batch must not repeat a unique_key")
    for j in jobs:
        if j.max_attempts is not None and j.max_attempts < 1:
            raise InvalidArgument("max_attempts must be at least 1")
        if j.unique_for is not None:
            if j.unique_key is None:
                raise InvalidArgument("unique_for needs a unique_key")
            if not (isinstance(j.unique_for, int | float) and math.isfinite(j.unique_for)
                    and j.unique_for > 0):
                raise InvalidArgument("unique_for must be a positive number of seconds")
            if j.unique_for < MIN_UNIQUE_FOR:
                raise InvalidArgument(f"unique_for must be at least {MIN_UNIQUE_FOR} seconds")
        if j.unique_key is not None and not (isinstance(j.unique_key, str)
                                             and 1 <= len(j.unique_key) <= 255):
            raise InvalidArgument("a unique_key is 1 to 255 characters")


async def enqueue(client: LeaseClient, queue: str, jobs: Sequence[NewJob],
                  default_max_attempts: int, connection: asyncpg.Connection | None,
                  *, count: bool = True) -> list[Enqueued]:
    """Add ``jobs`` to ``queue``; what became of each, in order. ``count``
    False: the caller counts them (``counted``) once its transaction holds."""
    if not jobs:
        return []
    check(jobs)
    done: dict[int, Enqueued] = {}  # by position in jobs
    todo = list(range(len(jobs)))
    for _ in range(UNIQUE_RETRIES):
        todo = await _insert(client, queue, jobs, todo, default_max_attempts, connection,
                             done)
        if not todo:
            break
    else:
        raise InvalidArgument("a unique key's holder kept changing: enqueue again")
    answers = [done[i] for i in range(len(jobs))]
    if count:
        counted(queue, answers)
    return answers


def counted(queue: str, answers: Sequence[Enqueued]) -> None:
    """``fencegate_jobs_total`` of an enqueue: the jobs added and deduplicated."""
    added = sum(1 for e in answers if not e.deduplicated)
    JOBS.labels(queue=queue, event="enqueued").inc(added)
    if len(answers) - added:
        JOBS.labels(queue=queue, event="deduplicated").inc(len(answers) - added)


async def _insert(client: LeaseClient, queue: str, jobs: Sequence[NewJob], todo: list[int],
                  default_max_attempts: int, connection: asyncpg.Connection | None,
                  done: dict[int, Enqueued]) -> list[int]:
    """Insert the jobs at ``todo``, filling ``done``; the positions still to
    insert (a unique slot found held, whose holder is gone by the look)."""
    batch = [jobs[i] for i in todo]
    rows = await client.fetch(
        "enqueue_jobs", queue, [json.dumps(j.payload) for j in batch],
        [j.dedupe_key for j in batch], [j.ordering_key for j in batch],
        [j.run_at for j in batch], [j.max_attempts or default_max_attempts for j in batch],
        [j.priority for j in batch], [j.unique_key for j in batch],
        [None if j.unique_for is None else float(j.unique_for) for j in batch],
        connection=connection)
    by_dedupe = {r["dedupe_key"]: r["id"] for r in rows if r["dedupe_key"] is not None}
    by_unique = {r["unique_key"]: r["id"] for r in rows
                 if r["dedupe_key"] is None and r["unique_key"] is not None}
    # rows come back in insertion order, which is the order given
    plain = iter(r["id"] for r in rows if r["dedupe_key"] is None and r["unique_key"] is None)
    skipped: list[int] = []
    for i in todo:
        j = jobs[i]
        if j.dedupe_key is not None:
            found = by_dedupe.get(j.dedupe_key)
        elif j.unique_key is not None:
            found = by_unique.get(j.unique_key)
        else:
            found = next(plain)
        if found is None:
            skipped.append(i)
        else:
            done[i] = Enqueued(found, False)
    if not skipped:
        return []
    # skipped: the first job's id, or the unique slot's holder, read in a
    # fresh snapshot
    dedupe = [jobs[i].dedupe_key for i in skipped if jobs[i].dedupe_key is not None]
    first = {r["dedupe_key"]: r["id"] for r in await client.fetch(
        "find_deduplicated", queue, dedupe, connection=connection)} if dedupe else {}
    unique = [i for i in skipped if jobs[i].dedupe_key not in first
              and jobs[i].unique_key is not None]
    holders = {r["unique_key"]: r["id"] for r in await client.fetch(
        "find_unique", queue, [jobs[i].unique_key for i in unique],
        [jobs[i].unique_for for i in unique], connection=connection)} if unique else {}
    again = []
    for i in skipped:
        j = jobs[i]
        found = first.get(j.dedupe_key) if j.dedupe_key is not None else None
        if found is None and j.unique_key is not None:
            found = holders.get(j.unique_key)
        if found is None:
            again.append(i)  # purged, or the slot freed, between the insert and the look
        else:
            done[i] = Enqueued(found, True)
    return again
