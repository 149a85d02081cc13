"""Group commit: calls made in the same turn of the event loop go to the
database as one statement and one commit.

Nothing waits for a timer: a lone call goes out at once. While as many
batches as allowed are out, new calls gather, and go together as soon as
one comes back: the busier the process, the bigger the batches, and the
fewer commits (each a WAL flush) per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from .metrics import BATCH_SIZE

In = TypeVar("In")
Out = TypeVar("Out")

#: the most calls one statement carries
MAX_BATCH = 256


class Batcher(Generic[In, Out]):
    """``await batcher(item)``: ``run`` is called with every item gathered, and
    answers one result per item, in order. If ``run`` raises, every caller of
    that batch gets the exception."""

    def __init__(self, run: Callable[[Sequence[In]], Awaitable[Sequence[Out]]], *,
                 max_in_flight: int = 2, max_batch: int = MAX_BATCH, name: str = "") -> None:
        self._run = run
        self._sizes = BATCH_SIZE.labels(statement=name) if name else None
        self.max_in_flight = max_in_flight
        self.max_batch = max_batch
        self._pending: list[tuple[In, asyncio.Future[Out]]] = []
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, item: In) -> Out:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Out] = loop.create_future()
        self._pending.append((item, fut))
        self._schedule()
        return await fut

    def _schedule(self) -> None:
        if self._scheduled or not self._pending or self._in_flight >= self.max_in_flight:
            return
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        batch = self._pending[:self.max_batch]
        del self._pending[:self.max_batch]
        batch = [(item, fut) for item, fut in batch if not fut.cancelled()]
        if not batch:
            self._schedule()
            return
        self._in_flight += 1
        if self._sizes is not None:
            self._sizes.observe(len(batch))
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._schedule()

    async def _send(self, batch: list[tuple[In, asyncio.Future[Out]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:  # every caller of the batch gets it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        else:
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
        finally:
            self._in_flight -= 1
            self._schedule()
