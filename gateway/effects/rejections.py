"""A bounded record of fence rejections, for the operators' console: which
resources the zombies were on, when, under which fence.

The effect path only appends to a buffer in memory (``note``); a background
task writes the buffer in one statement at most once a second, so a storm of
zombies costs the database one insert per second per gateway process, not one
per refusal. The buffer is bounded: past ``MAX_BUFFERED`` rejections between
two writes, the rest are only counted (``dropped``; the Prometheus counter
``fencegate_fence_rejections_total`` still counts every one). Rows are purged
after ``RETENTION_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from leases import Database, Unavailable

log = logging.getLogger("fencegate.rejections")

FLUSH_SECONDS = 1.0
MAX_BUFFERED = 1000
RETENTION_SECONDS = 7 * 86400.0
PURGE_EVERY_SECONDS = 600.0
PURGE_BATCH = 5000


@dataclass(frozen=True)
class Rejection:
    client: str
    provider: str
    reason: str  #: a FenceRefusal (wire.py)
    resource: str
    fence: int
    current_fence: int | None
    key: str
    #: when the gateway refused it, on its monotonic clock
    seen: float


class RejectionLog:
    """This process's buffer of rejections, and the task that writes it."""

    def __init__(self, db: Database, *, retention_seconds: float = RETENTION_SECONDS) -> None:
        self.db = db
        self.retention_seconds = retention_seconds
        self.dropped = 0
        self._buffer: list[Rejection] = []
        self._task: asyncio.Task[None] | None = None
        #: set after each pass of the background task (a test hook)
        self.flushed = asyncio.Event()

    def note(self, client: str, provider: str, reason: str, resource: str, fence: int,
             current_fence: int | None, key: str) -> None:
        """Remember one rejection; never blocks, never fails."""
        if len(self._buffer) >= MAX_BUFFERED:
            self.dropped += 1
            return
        self._buffer.append(Rejection(client, provider, reason, resource, fence, current_fence,
                                      key, time.monotonic()))

    async def flush(self) -> int:
        """Write what is buffered, in one statement; how many. If the database
        does not answer, the batch is put back (within the bound)."""
        batch, self._buffer = self._buffer, []
        if not batch:
            return 0
        now = time.monotonic()
        try:
            await self.db.execute(
                "record_rejections", [now - r.seen for r in batch], [r.client for r in batch],
                [r.provider for r in batch], [r.reason for r in batch],
                [r.resource for r in batch], [r.fence for r in batch],
                [r.current_fence for r in batch], [r.key for r in batch])
        except Unavailable:
            room = MAX_BUFFERED - len(self._buffer)
            self._buffer[:0] = batch[:room]
            self.dropped += max(0, len(batch) - room)
            raise
        return len(batch)

    async def purge(self) -> int:
        total = 0
        while True:
            done = await self.db.execute("purge_rejections", self.retention_seconds,
                                         PURGE_BATCH)
            total += done
            if done < PURGE_BATCH:
                return total

    async def _run(self) -> None:
        last_purge = float("-inf")
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            try:
                await self.flush()
                if time.monotonic() - last_purge >= PURGE_EVERY_SECONDS:
                    last_purge = time.monotonic()
                    await self.purge()
            except Unavailable:
                log.warning("fence rejections not recorded yet: database unreachable")
            except Exception as exc:  # the loop never dies
                log.error("recording fence rejections failed: %s", exc, exc_info=True)
            self.flushed.set()
            self.flushed.clear()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the task and write what is left (best effort)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Unavailable):
            await self.flush()
