"""The outcome writer: the ends of attempts, recorded behind the answers in
batches (``fencegate_finish_effects``; group commit, leases/batch.py), each
against its attempt's nonce, once, however often its statement is tried
again. It is the gateway's one way to write in the background and try
again: what will not land in ``RECORD_RETRY_SECONDS`` is given up, logged
and counted."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.metrics import RECORDS_GIVEN_UP
from leases import Busy, Database, Unavailable
from leases.batch import Entry, GroupCommit

log = logging.getLogger("fencegate.gateway")

#: how long an outcome that could not be recorded is retried in the background
#: (no answer, or a refusal: a cancelled statement, a deadlock); then it is
#: given up, logged and counted (fencegate_effect_records_given_up_total)
RECORD_RETRY_SECONDS = 60.0
#: the pause before a record that got no answer, or was refused, is tried again
RECORD_RETRY_PAUSE_SECONDS = 1.0
#: the pause before a record whose lease row was held elsewhere (``busy``)
#: goes again: not a spin
BUSY_PAUSE_SECONDS = 0.005
#: the most attempt ends one statement records
OUTCOME_BATCH = 256

#: one attempt's end: the arguments of finish_effect
_Args = tuple[Any, ...]
_Entry = Entry[_Args, str]


class GivenUp(Exception):
    """A record that did not land in time, and is not tried again."""


def _give_up(entry: _Entry, exc: BaseException | None) -> None:
    """A record that will not land: the effect reads in flight, then unknown
    (never sent again); whoever waits for it is told; logged and counted."""
    args, fut = entry.item, entry.future
    if not fut.done():
        given_up = GivenUp("not recorded in time")
        given_up.__cause__ = exc
        fut.set_exception(given_up)
    RECORDS_GIVEN_UP.labels(state=args[4]).inc()
    log.error("could not record an effect's outcome; it will read as unknown",
              extra={"client": args[0], "key": args[1], "state": args[4],
                     "error": type(exc).__name__ if exc else "none"})


class OutcomeWriter(GroupCommit[_Args, str]):
    """Records the ends of attempts behind the answers, one statement at a
    time: whatever gathered while the last statement was out goes in the
    next one. An entry whose lease row another transaction holds (``busy``)
    goes again in a moment. A statement that got no answer, or that the
    database refused (cancelled, a deadlock, a statement timeout: it
    committed nothing), is tried again every ``RECORD_RETRY_PAUSE_SECONDS``
    (a refused batch at once, one entry at a time, so one refused record
    does not hold the others), until ``RECORD_RETRY_SECONDS`` after the
    entry was queued; then the entry is given up, logged and counted (the
    effect reads in flight, then unknown: never sent again). Tried again, an
    end still counts once: its nonce."""

    def __init__(self, db: Database) -> None:
        super().__init__(max_in_flight=1, max_batch=OUTCOME_BATCH, name="finish")
        self.db = db
        #: (client, key) → the record not landed yet
        self._by_key: dict[tuple[str, str], asyncio.Future[str]] = {}
        #: the records nobody waits for (``add(waited=False)``)
        self._unwaited: set[asyncio.Future[str]] = set()

    def add(self, args: _Args, waited: bool = True) -> asyncio.Future[str]:
        """Queue one attempt's end; the future is done once it is recorded
        (what it came to), or given up (``GivenUp``). ``waited``: someone in
        this process waits for it: a repeat of its key waits for it
        (``pending``), and a refusal is told at once (it is tried again all
        the same). Not waited, the future is done only once it has landed or
        was given up."""
        fut = self.submit(args)
        key = (args[0], args[1])
        if waited:
            self._by_key[key] = fut
        else:
            self._unwaited.add(fut)
        fut.add_done_callback(lambda f: self._forget(key, f))
        return fut

    def _forget(self, key: tuple[str, str], fut: asyncio.Future[str]) -> None:
        if self._by_key.get(key) is fut:
            del self._by_key[key]
        self._unwaited.discard(fut)
        if not fut.cancelled():
            fut.exception()  # retrieved: logged already where it matters

    def pending(self, client: str, key: str) -> asyncio.Future[str] | None:
        """The record of ``key``'s last attempt, if this process has not
        landed it yet."""
        return self._by_key.get((client, key))

    async def drain(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until everything queued is recorded, the
        statement being written and the records to be tried again included;
        what is left then is given up (logged, counted)."""
        await self.close(timeout)

    def _keep(self, entry: _Entry) -> bool:
        return True  # sent until it lands or is given up, whether anyone waits or not

    def _left(self, entry: _Entry) -> None:
        _give_up(entry, None)

    async def _send(self, batch: list[_Entry]) -> None:
        try:
            done = await self._write([entry.item for entry in batch])
        except (Unavailable, Busy) as exc:
            for entry in batch:
                self._again(entry, exc)
            return
        except Exception as exc:  # refused: it committed nothing
            if not self.one_by_one(batch):
                self._again(batch[0], exc, alone=True)
            return
        busy = []
        for entry, d in zip(batch, done, strict=True):
            if d != "busy":
                if not entry.future.done():
                    entry.future.set_result(d)
            elif asyncio.get_running_loop().time() - entry.queued_at < RECORD_RETRY_SECONDS:
                entry.alone = False
                busy.append(entry)
            else:  # a lease row held for a minute: given up as any other
                _give_up(entry, None)
        self.requeue(busy, after=BUSY_PAUSE_SECONDS)

    def _again(self, entry: _Entry, exc: BaseException, alone: bool = False) -> None:
        """Try ``entry`` again in a moment, unless it has been tried for
        ``RECORD_RETRY_SECONDS``. A refused one (``alone``) is tried alone,
        and whoever waits for it is told now: it has not landed."""
        if asyncio.get_running_loop().time() - entry.queued_at >= RECORD_RETRY_SECONDS:
            _give_up(entry, exc)
            return
        entry.alone = alone
        if alone:
            args = entry.item
            log.warning("the database refused an effect's outcome; trying again",
                        extra={"client": args[0], "key": args[1], "state": args[4],
                               "error": type(exc).__name__})
            if not entry.future.done() and entry.future not in self._unwaited:
                entry.future.set_exception(exc)
        self.requeue([entry], after=RECORD_RETRY_PAUSE_SECONDS)

    async def _write(self, batch: list[_Args]) -> list[str]:
        # alone, it waits for a lease row held elsewhere (a batch answers busy),
        # and its p50 is 68-100 µs (9-23 %) under a batch of one: bench/RESULTS.md
        if len(batch) == 1:
            return [await self.db.fetchval("finish_effect", *batch[0])]
        rows = await self.db.fetch("finish_effects", *(list(c) for c in zip(*batch,
                                                                               strict=True)))
        by_ord = {r["ord"]: r["done"] for r in rows}
        return [by_ord[n + 1] for n in range(len(batch))]
