"""Waiting for a condition instead of a wall-clock window: a test polls what
it needs to be true, with a bound generous enough for a loaded machine."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

#: long enough for a busy 2-core machine; a test that passes waits far less
GENEROUS_SECONDS = 30.0


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, *,
                seconds: float = GENEROUS_SECONDS, every: float = 0.02) -> None:
    """Return once ``check()`` (sync or async) is true; fail the test, naming
    ``what`` it waited for, if it is still false after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        answer = check()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"not within {seconds:g}s: {what}")
        await asyncio.sleep(every)
