"""A paused lease holder whose next step was already due when the pause
began: that step is its last, and it cannot act under the lost lease."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from leases import LeaseClient, LeaseLost
from tests.support.pause import pause_until_taken


async def test_a_step_already_due_when_the_pause_began_runs_but_cannot_act(
    pool: asyncpg.Pool, dsn: str,
) -> None:
    """The timerfd is only seen at the loop's next check for I/O, and the
    default loop first runs every callback already in its ready queue. If the
    block's answer arrived just before the pause (its wakeup is queued: here a
    future set by the callback that then stalls, as a protocol's
    data_received would), the block runs that one step after waking, its
    lease long expired and another owner free to take the resource.

    No event loop hook can stop a step that is already queued, so the
    guarantee is stated as what holds: that step is the last one (it never
    gets past its next await), and ``lease.check()`` in it refuses, so a side
    effect guarded by it does not happen (docs/leases.md says exactly
    this)."""
    a = LeaseClient(pool=pool, owner="a")
    lease = await a.claim("run:1", ttl=0.5)
    assert lease is not None
    loop = asyncio.get_running_loop()
    acted: list[str] = []
    refused: list[str] = []
    taken: list[int] = []
    with pytest.raises(LeaseLost):
        async with lease:
            await asyncio.sleep(0.05)  # the keeper has started and sleeps on its timer
            answer: asyncio.Future[str] = loop.create_future()

            def answer_then_stall() -> None:
                answer.set_result("the database answered")  # the block's wakeup is queued
                # ... and the process stops (GC, SIGSTOP, VM freeze) until the
                # lease has expired server-side and another owner holds it
                taken.append(pause_until_taken(dsn, "run:1"))

            loop.call_soon(answer_then_stall)
            await answer
            try:
                lease.check()  # what a side effect outside the gateway must do first
            except LeaseLost:
                refused.append("check refused")
                raise
            acted.append("acted after the pause")  # the zombie's side effect
            await asyncio.sleep(0)
            acted.append("and went on")
    assert refused == ["check refused"] and acted == []
    # the lease had expired in the database: another owner won it in the pause
    assert taken and taken[0] > lease.fence


async def test_a_lost_lease_cancels_a_block_in_wait_for_for_good(
    pool: asyncpg.Pool, dsn: str,
) -> None:
    """Rule 6: on loss "the guarded work is cancelled". The Lease cancelled
    the guarded task once. On Python 3.11 (this project's floor),
    ``asyncio.wait_for`` swallows a cancellation that arrives in the same loop
    turn as its inner result (gh-86296: "if fut.done(): return fut.result()"),
    which is exactly what happens after a pause, when the deadline alarm and
    the block's answer are both due on waking. The single cancel was lost and
    the block ran on to its end with its lease gone.

    Now the block is cancelled again until it exits: it may finish the step
    the swallowed cancellation let through (where ``lease.check()`` refuses),
    and goes no further."""
    a = LeaseClient(pool=pool, owner="a")
    lease = await a.claim("run:1", ttl=0.5)
    assert lease is not None
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    with pytest.raises(LeaseLost):
        async with lease:
            await asyncio.sleep(0.05)  # the keeper has started and sleeps on its timer
            answer: asyncio.Future[str] = loop.create_future()
            # the process stops while we wait, until another owner holds the lease ...
            loop.call_later(0.05, pause_until_taken, dsn, "run:1")
            loop.call_later(0.1, answer.set_result, "row")  # ... and the answer is due
            await asyncio.wait_for(answer, 10)
            steps.append("checked" if lease.lost else "used the answer")
            await asyncio.sleep(0.01)
            steps.append("and went on")
            for _ in range(100):
                await asyncio.sleep(0)
                steps.append("and on")
    assert steps in ([], ["checked"]), f"the block kept running after its lease was lost: {steps}"
