"""Running a real ``Worker`` in a test until the database says it is done."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import asyncpg

from leases import Worker


async def run_worker_until(worker: Worker, pool: asyncpg.Pool, query: str,
                           *args: Any) -> list[dict[str, Any]]:
    """Run ``worker`` while ``query`` (with ``args``) answers true, then stop
    it and wait for ``run()`` to return; what the event loop reported as
    unhandled meanwhile (a task whose exception nobody retrieved says so when
    it is collected, hence the collection before the handler is put back)."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    task = asyncio.create_task(worker.run())
    try:
        while await pool.fetchval(query, *args):
            assert not task.done(), task
            await asyncio.sleep(0.02)
    finally:
        worker.stop()
        await task
        gc.collect()
        loop.set_exception_handler(previous)
    return unhandled
