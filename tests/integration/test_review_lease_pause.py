"""Review: a paused lease holder whose next step was already due when the
pause began."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from leases import LeaseClient, LeaseLost


async def test_a_step_already_due_when_the_pause_began_still_runs_after_it(
    pool: asyncpg.Pool,
) -> None:
    """Lease's docstring: "once the local deadline has passed ..., the block is
    cancelled at its next await; ... the deadline alarm is seen before any
    event-loop timer that fell due during a pause, so a block waiting on a
    timer or a socket does not run another step."

    The timerfd is only seen at the loop's next select, and the default loop
    runs every callback already in its ready queue first. If the block's
    answer arrived just before the pause (its wakeup is queued: here a future
    set by the callback that then stalls, as a protocol's data_received would),
    the block runs one more step after waking, its lease long expired and
    another owner holding the resource. The existing test of a pause passes
    only because its block never yielded before the pause, so the keeper's
    first step was queued ahead of the block's.
    """
    a = LeaseClient(pool=pool, owner="a")
    lease = await a.claim("run:1", ttl=0.5)
    assert lease is not None
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    with pytest.raises(LeaseLost):
        async with lease:
            await asyncio.sleep(0.05)  # the keeper has started and sleeps on its timer
            answer: asyncio.Future[str] = loop.create_future()

            def answer_then_stall() -> None:
                answer.set_result("the database answered")  # the block's wakeup is queued
                time.sleep(1.0)  # ... and the process stops (GC, SIGSTOP, VM freeze)
                # meanwhile the lease expired server-side (ttl 0.5)

            loop.call_soon(answer_then_stall)
            await answer
            steps.append("acted after the pause")  # the zombie's extra step
            await asyncio.sleep(0)
    # the lease had expired in the database: another owner wins it now
    assert await LeaseClient(pool=pool, owner="b").claim("run:1", ttl=30) is not None
    assert steps == [], "the block ran a step after its deadline passed during a pause"


async def test_a_lost_lease_cancels_a_block_in_wait_for_for_good(pool: asyncpg.Pool) -> None:
    """Rule 6: on loss "the guarded work is cancelled". The Lease cancels the
    guarded task once. On Python 3.11 (this project's floor, and the version it
    runs on), ``asyncio.wait_for`` swallows a cancellation that arrives in the
    same loop turn as its inner result (gh-86296: "if fut.done(): return
    fut.result()"), which is exactly what happens after a pause, when the
    deadline alarm and the block's answer are both due on waking. The single
    cancel is lost and the block runs on to its end with its lease gone
    (LeaseLost only comes out of __aexit__ afterwards)."""
    a = LeaseClient(pool=pool, owner="a")
    lease = await a.claim("run:1", ttl=0.5)
    assert lease is not None
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    with pytest.raises(LeaseLost):
        async with lease:
            await asyncio.sleep(0.05)  # the keeper has started and sleeps on its timer
            answer: asyncio.Future[str] = loop.create_future()
            loop.call_later(0.05, time.sleep, 1.0)  # the process stops while we wait ...
            loop.call_later(0.1, answer.set_result, "row")  # ... and the answer is due
            await asyncio.wait_for(answer, 10)
            steps.append("used the answer")
            await asyncio.sleep(0.01)
            steps.append("and went on")
    assert steps == [], f"the block kept running after its lease was lost: {steps}"
