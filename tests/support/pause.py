"""A stop-the-world pause of the test's process that lasts until another
owner has taken a resource: the zombie's story without guessing how long
the pause must be (on a loaded machine no guess is long enough)."""

from __future__ import annotations

import asyncio
import threading
import time

from leases import LeaseClient
from tests.support.waiting import GENEROUS_SECONDS


def pause_until_taken(dsn: str, resource: str, owner: str = "b") -> int:
    """Block the calling thread (an event loop's: nothing in it runs) while
    ``owner``, on a thread and a connection of its own, claims ``resource``
    until it wins; the fence it won. The pause lasts past the lease's expiry
    in the database, and so past its holder's local deadline too."""
    won: list[int] = []

    def other_worker() -> None:
        async def claim() -> None:
            give_up = time.monotonic() + GENEROUS_SECONDS
            async with LeaseClient(dsn, owner=owner) as other:
                while time.monotonic() < give_up:
                    got = await other.claim(resource, ttl=30)
                    if got is not None:
                        won.append(got.fence)
                        return
                    await asyncio.sleep(0.02)
        asyncio.run(claim())

    thread = threading.Thread(target=other_worker)
    thread.start()
    thread.join()
    assert won, f"{owner} never claimed {resource} (not within {GENEROUS_SECONDS:g}s)"
    return won[0]
