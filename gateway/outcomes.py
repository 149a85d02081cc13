"""The outcome writer: the ends of attempts, recorded behind the answers in
batches (``fencegate_finish_effects``), each against its attempt's nonce,
once, however often its statement is tried again; what will not land in
``RECORD_RETRY_SECONDS`` is given up, logged and counted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from gateway.metrics import RECORDS_GIVEN_UP
from leases import Busy, Database, Unavailable
from leases.metrics import BATCH_SIZE

log = logging.getLogger("fencegate.gateway")

#: how long an outcome that could not be recorded is retried in the background
#: (no answer, or a refusal: a cancelled statement, a deadlock); then it is
#: given up, logged and counted (fencegate_effect_records_given_up_total)
RECORD_RETRY_SECONDS = 60.0
#: the pause before a record that got no answer, or was refused, is tried again
RECORD_RETRY_PAUSE_SECONDS = 1.0
#: the most attempt ends one statement records
OUTCOME_BATCH = 256
OUTCOME_SIZES = BATCH_SIZE.labels(statement="finish")


#: one attempt's end waiting to be recorded: its arguments, who waits, since when
_Entry = tuple[tuple[Any, ...], asyncio.Future[str], float]


def _give_up(entry: _Entry, exc: BaseException | None) -> None:
    """A record that will not land: the effect reads in flight, then unknown
    (never sent again); whoever waits for it is told; logged and counted."""
    args, fut, _ = entry
    if not fut.done():
        fut.set_exception(exc or RuntimeError("not recorded in time"))
    RECORDS_GIVEN_UP.labels(state=args[4]).inc()
    log.error("could not record an effect's outcome; it will read as unknown",
              extra={"client": args[0], "key": args[1], "state": args[4],
                     "error": type(exc).__name__ if exc else "none"})


class OutcomeWriter:
    """Records the ends of attempts behind the answers: whatever gathered
    while the last statement was out goes in the next one. An entry whose
    lease row another transaction holds (``busy``) goes in the next batch. A
    statement that got no answer, or that the database refused (cancelled, a
    deadlock, a statement timeout: it committed nothing), is tried again
    every ``RECORD_RETRY_PAUSE_SECONDS`` (a refused batch at once, one entry
    at a time, so one refused record does not hold the others), until
    ``RECORD_RETRY_SECONDS`` after the entry was queued; then the entry is
    given up, logged and counted (the effect reads in flight, then unknown:
    never sent again). Tried again, an end still counts once: its nonce."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._pending: list[_Entry] = []
        #: entries to try again, with when, and whether alone (refused alone)
        self._later: list[tuple[float, _Entry, bool]] = []
        #: the entries of the statement out now
        self._writing: list[_Entry] = []
        #: (client, key) → the record not landed yet
        self._by_key: dict[tuple[str, str], asyncio.Future[str]] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.Event | None = None

    def add(self, args: tuple[Any, ...], waited: bool = True) -> asyncio.Future[str]:
        """Queue one attempt's end; the future is done once it is recorded (or
        the database refused it: it is still tried again). ``waited``: a
        repeat of its key in this process waits for it (``pending``)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()
        self._pending.append((args, fut, loop.time()))
        key = (args[0], args[1])
        if waited:
            self._by_key[key] = fut
        fut.add_done_callback(lambda f: self._forget(key, f))
        if self._task is None or self._task.done():
            self._wake, self._idle = asyncio.Event(), asyncio.Event()
            self._task = loop.create_task(self._run())
        assert self._wake is not None and self._idle is not None
        self._idle.clear()
        self._wake.set()
        return fut

    def _forget(self, key: tuple[str, str], fut: asyncio.Future[str]) -> None:
        if self._by_key.get(key) is fut:
            del self._by_key[key]
        if not fut.cancelled():
            fut.exception()  # retrieved: logged already where it matters

    def pending(self, client: str, key: str) -> asyncio.Future[str] | None:
        """The record of ``key``'s last attempt, if this process has not
        landed it yet."""
        return self._by_key.get((client, key))

    async def _run(self) -> None:
        assert self._wake is not None and self._idle is not None
        loop = asyncio.get_running_loop()
        while True:
            alone = self._due(loop.time())
            if alone:
                await self._each_alone(alone)
                continue
            if not self._pending:
                if not self._later:
                    self._idle.set()
                self._wake.clear()
                until = min(t for t, _, _ in self._later) - loop.time() if self._later \
                    else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), until)
                continue
            batch = self._pending[:OUTCOME_BATCH]
            del self._pending[:OUTCOME_BATCH]
            OUTCOME_SIZES.observe(len(batch))
            self._writing = batch
            try:
                done = await self._write([args for args, _, _ in batch])
            except (Unavailable, Busy) as exc:
                for entry in batch:
                    self._again(entry, exc)
                continue
            except Exception as exc:  # refused: it committed nothing; never the loop's end
                if len(batch) == 1:
                    self._again(batch[0], exc, alone=True)
                else:  # one refused record must not take the others with it
                    await self._each_alone(batch)
                continue
            finally:
                self._writing = []
            if self._landed(batch, done):
                await asyncio.sleep(0.005)  # a lease row held elsewhere: not a spin

    def _due(self, now: float) -> list[_Entry]:
        """Move the entries due to be tried again back to the queue; answer
        those to be tried alone."""
        alone: list[_Entry] = []
        later = []
        for t, entry, by_itself in self._later:
            if t > now:
                later.append((t, entry, by_itself))
            elif by_itself:
                alone.append(entry)
            else:
                self._pending.append(entry)
        self._later = later
        return alone

    def _again(self, entry: _Entry, exc: BaseException, alone: bool = False) -> None:
        """Try ``entry`` again in a moment, unless it has been tried for
        ``RECORD_RETRY_SECONDS``. A refused one (``alone``) is tried alone,
        and whoever waits for it is told now: it has not landed."""
        now = asyncio.get_running_loop().time()
        args, fut, since = entry
        if now - since >= RECORD_RETRY_SECONDS:
            _give_up(entry, exc)
            return
        if alone:
            log.warning("the database refused an effect's outcome; trying again",
                        extra={"client": args[0], "key": args[1], "state": args[4],
                               "error": type(exc).__name__})
            if not fut.done():
                fut.set_exception(exc)
        self._later.append((now + RECORD_RETRY_PAUSE_SECONDS, entry, alone))

    def _landed(self, batch: list[_Entry], done: list[str]) -> bool:
        """Settle what was recorded; requeue what found its lease row held
        elsewhere (``busy``), and say whether any did."""
        busy = [e for e, d in zip(batch, done, strict=True) if d == "busy"]
        for (_, fut, _), d in zip(batch, done, strict=True):
            if d != "busy" and not fut.done():
                fut.set_result(d)
        now = asyncio.get_running_loop().time()
        for entry in busy:  # a lease row held for a minute: given up as any other
            if now - entry[2] < RECORD_RETRY_SECONDS:
                self._pending.append(entry)
            else:
                _give_up(entry, None)
        return bool(busy)

    async def _each_alone(self, batch: list[_Entry]) -> None:
        for entry in batch:
            self._writing = [entry]
            try:
                done = await self._write([entry[0]])
            except (Unavailable, Busy) as exc:
                self._again(entry, exc)
            except Exception as exc:
                self._again(entry, exc, alone=True)
            else:
                self._landed([entry], done)
            finally:
                self._writing = []

    async def _write(self, batch: list[tuple[Any, ...]]) -> list[str]:
        if len(batch) == 1:
            return [await self.db.fetchval("finish_effect", *batch[0])]
        rows = await self.db.fetch("finish_effects", *(list(c) for c in zip(*batch,
                                                                               strict=True)))
        by_ord = {r["ord"]: r["done"] for r in rows}
        return [by_ord[n + 1] for n in range(len(batch))]

    async def drain(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until everything queued is recorded, the
        statement being written and the records to be tried again included;
        what is left then is given up (logged, counted)."""
        if self._idle is not None and not self._idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        left = self._writing + self._pending + [entry for _, entry, _ in self._later]
        self._writing, self._pending, self._later = [], [], []
        for entry in left:
            _give_up(entry, None)
