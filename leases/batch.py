"""Group commit: calls made in the same turn of the event loop go to the
database as one statement and one commit.

Nothing waits for a timer: a lone call goes out at once. While as many
batches as allowed are out, new calls gather, and go together as soon as
one comes back: the busier the process, the bigger the batches, and the
fewer commits (each a WAL flush) per call.

``GroupCommit`` is the one mechanism: it gathers the calls, bounds a batch
and the statements out at once, drops what no longer needs sending, sends
a refused batch again one call per statement, takes calls back to be sent
again (at once or later), and closes within a deadline. What a batch's
answer means is each user's own: ``Batcher`` (each caller awaits its own
answer: the lease client's claims, renewals and releases, admissions), the
worker's completions (leases/completion.py) and the gateway's outcome
writer (gateway/outcomes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from .metrics import BATCH_SIZE

In = TypeVar("In")
Out = TypeVar("Out")

#: the most calls one statement carries
MAX_BATCH = 256


@dataclass(eq=False)
class Entry(Generic[In, Out]):
    """One call: what to send, who waits for its answer, when it was queued
    (the event loop's clock), and whether it goes in a statement of its own
    (it was refused with others)."""

    item: In
    future: asyncio.Future[Out]
    queued_at: float
    alone: bool = False


class GroupCommit(Generic[In, Out]):
    """Gathers calls into batches and sends each with ``_send``, which its
    users define: what a batch's answer, or its failure, means for each call.

    ``max_in_flight`` bounds the statements out at once (``None``: each
    turn's calls go at once, whatever is out); ``max_batch`` the calls one
    statement carries. A call whose future is done by the time its batch
    leaves (its caller was cancelled) is dropped (``_keep`` says which)."""

    def __init__(self, *, max_in_flight: int | None = 2, max_batch: int = MAX_BATCH,
                 name: str = "") -> None:
        self._sizes = BATCH_SIZE.labels(statement=name) if name else None
        self.max_in_flight = max_in_flight
        self.max_batch = max_batch
        self._pending: list[Entry[In, Out]] = []
        #: calls to be sent again later, each with its timer
        self._later: dict[Entry[In, Out], asyncio.TimerHandle] = {}
        #: the statements out, each with its calls
        self._out: dict[asyncio.Task[None], list[Entry[In, Out]]] = {}
        self._flushing: asyncio.Handle | None = None
        #: while ``close`` cancels what is out, nothing new goes out
        self._closing = False
        #: set while nothing is queued, out, or to be sent again
        self._idle = asyncio.Event()
        self._idle.set()

    def submit(self, item: In) -> asyncio.Future[Out]:
        """Queue one call; its future has the answer."""
        loop = asyncio.get_running_loop()
        entry: Entry[In, Out] = Entry(item, loop.create_future(), loop.time())
        self._pending.append(entry)
        self._changed()
        return entry.future

    def requeue(self, entries: Iterable[Entry[In, Out]], *, after: float = 0.0,
                first: bool = False) -> None:
        """Queue calls again: after ``after`` seconds, or now (``first``:
        ahead of the others)."""
        entries = list(entries)
        if after > 0:
            loop = asyncio.get_running_loop()
            for entry in entries:
                self._later[entry] = loop.call_later(after, self._due, entry)
        elif first:
            self._pending[:0] = entries
        else:
            self._pending.extend(entries)
        self._changed()

    def one_by_one(self, batch: list[Entry[In, Out]]) -> bool:
        """A batch the database refused (one of its calls may be at fault,
        and the refusal would take the others with it): each call goes again
        in a statement of its own, ahead of the queue, so a bad one costs only
        itself. False for a lone call: the refusal is its own answer."""
        if len(batch) == 1:
            return False
        for entry in batch:
            entry.alone = True
        self.requeue(batch, first=True)
        return True

    def _due(self, entry: Entry[In, Out]) -> None:
        if self._later.pop(entry, None) is not None:
            self._pending.append(entry)
            self._changed()

    def _keep(self, entry: Entry[In, Out]) -> bool:
        """Whether ``entry`` is still to be sent: by default, while its caller
        waits."""
        return not entry.future.done()

    async def _send(self, batch: list[Entry[In, Out]]) -> None:
        """Send ``batch`` as one statement and settle its calls."""
        raise NotImplementedError

    def _left(self, entry: Entry[In, Out]) -> None:
        """A call still unanswered when ``close`` ended: by default its
        caller's future is cancelled."""
        entry.future.cancel()

    def _changed(self) -> None:
        if self._pending or self._out or self._later:
            self._idle.clear()
        else:
            self._idle.set()
        if self._flushing is None and self._pending and not self._closing and (
                self.max_in_flight is None or len(self._out) < self.max_in_flight):
            self._flushing = asyncio.get_running_loop().call_soon(self._flush)

    def _take(self) -> list[Entry[In, Out]]:
        """The next batch: a call to go alone, else the first ``max_batch``."""
        for n, entry in enumerate(self._pending):
            if entry.alone:
                return [self._pending.pop(n)]
        batch = self._pending[:self.max_batch]
        del self._pending[:self.max_batch]
        return batch

    def _flush(self) -> None:
        self._flushing = None
        if self._closing:
            return
        batch = [entry for entry in self._take() if self._keep(entry)]
        if batch:
            if self._sizes is not None:
                self._sizes.observe(len(batch))
            task = asyncio.get_running_loop().create_task(self._sending(batch))
            self._out[task] = batch
            task.add_done_callback(self._sent)  # also when cancelled before it ran
        self._changed()

    async def _sending(self, batch: list[Entry[In, Out]]) -> None:
        try:
            await self._send(batch)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._sent(task)

    def _sent(self, task: asyncio.Task[None]) -> None:
        if self._out.pop(task, None) is not None:
            self._changed()

    async def close(self, timeout: float) -> None:
        """Send what is queued, and wait up to ``timeout`` until every call
        is answered, those to be sent again included; then cancel the
        statements still out, so nothing is left running, and hand each call
        still unanswered to ``_left``."""
        if self._flushing is not None:
            self._flushing.cancel()
            self._flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        self._closing = True
        try:
            out = dict(self._out)
            for task in out:
                task.cancel()
            if out:
                await asyncio.wait(out)
        finally:
            self._closing = False
        for handle in self._later.values():
            handle.cancel()
        # a statement cut short answered none of its calls
        left = dict.fromkeys([*self._pending, *self._later,
                              *(entry for batch in out.values() for entry in batch)])
        self._pending, self._later = [], {}
        self._changed()
        for entry in left:
            self._left(entry)


class Batcher(GroupCommit[In, Out]):
    """``await batcher(item)``: ``run`` is called with every item gathered, and
    answers one result per item, in order. If ``run`` raises, every caller of
    that batch gets the exception."""

    def __init__(self, run: Callable[[Sequence[In]], Awaitable[Sequence[Out]]], *,
                 max_in_flight: int = 2, max_batch: int = MAX_BATCH, name: str = "") -> None:
        super().__init__(max_in_flight=max_in_flight, max_batch=max_batch, name=name)
        self._run = run

    async def __call__(self, item: In) -> Out:
        return await self.submit(item)

    async def _send(self, batch: list[Entry[In, Out]]) -> None:
        try:
            results = await self._run([entry.item for entry in batch])
        except asyncio.CancelledError:
            for entry in batch:
                entry.future.cancel()
            raise
        except Exception as exc:  # every caller of the batch gets it
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(exc)
        else:
            for entry, result in zip(batch, results, strict=True):
                if not entry.future.done():
                    entry.future.set_result(result)
