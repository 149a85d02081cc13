"""Group commit's gatherer: what it sends together, and what each caller gets."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from leases.batch import Batcher, Entry, GroupCommit


class Recorder:
    """The statement a batcher runs: records each batch; with ``hold``, each
    batch stays out until the test sets it."""

    def __init__(self, fail: bool = False, hold: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.fail = fail
        self.released = asyncio.Event()
        if not hold:
            self.released.set()

    async def out(self, n: int) -> None:
        """Until ``n`` batches have been sent."""
        while len(self.batches) < n:
            await asyncio.sleep(0)

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await self.released.wait()
        if self.fail:
            raise RuntimeError("the database said no")
        return [i * 10 for i in items]


async def test_calls_of_one_turn_go_together_and_each_gets_its_own_answer() -> None:
    run = Recorder()
    batcher: Batcher[int, int] = Batcher(run)
    assert await asyncio.gather(*(batcher(i) for i in range(5))) == [0, 10, 20, 30, 40]
    assert run.batches == [[0, 1, 2, 3, 4]]


async def test_a_lone_call_goes_at_once() -> None:
    run = Recorder()
    batcher: Batcher[int, int] = Batcher(run)
    assert await batcher(7) == 70
    assert await batcher(8) == 80
    assert run.batches == [[7], [8]]


async def test_calls_made_while_the_batches_are_out_gather_for_the_next() -> None:
    run = Recorder(hold=True)
    batcher: Batcher[int, int] = Batcher(run, max_in_flight=1)
    first = asyncio.ensure_future(batcher(0))
    await run.out(1)  # the first batch is out, and stays out
    rest = asyncio.gather(*(batcher(i) for i in range(1, 4)))
    for _ in range(10):  # turns enough for the three to be sent, were they sent now
        await asyncio.sleep(0)
    run.released.set()
    assert await first == 0 and await rest == [10, 20, 30]
    assert run.batches == [[0], [1, 2, 3]]


async def test_every_caller_of_a_failed_batch_gets_the_error() -> None:
    batcher: Batcher[int, int] = Batcher(Recorder(fail=True))
    results = await asyncio.gather(*(batcher(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_a_caller_cancelled_before_its_batch_left_is_not_sent() -> None:
    run = Recorder(hold=True)
    batcher: Batcher[int, int] = Batcher(run, max_in_flight=1)
    first = asyncio.ensure_future(batcher(0))
    await run.out(1)  # the first batch is out, and stays out
    gone = asyncio.ensure_future(batcher(1))
    kept = asyncio.ensure_future(batcher(2))
    await asyncio.sleep(0)
    gone.cancel()
    run.released.set()
    assert await first == 0 and await kept == 20
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert run.batches == [[0], [2]]


async def test_batches_are_bounded() -> None:
    run = Recorder()
    batcher: Batcher[int, int] = Batcher(run, max_batch=2, max_in_flight=1)
    assert await asyncio.gather(*(batcher(i) for i in range(5))) == [0, 10, 20, 30, 40]
    assert [len(b) for b in run.batches] == [2, 2, 1]


class Picky(GroupCommit[int, int]):
    """Refuses any statement carrying a negative number, as the database
    refuses a batch for one bad row; a refused lone call is its own answer."""

    def __init__(self) -> None:
        super().__init__(max_in_flight=1)
        self.batches: list[list[int]] = []

    async def _send(self, batch: list[Entry[int, int]]) -> None:
        items = [e.item for e in batch]
        self.batches.append(items)
        await asyncio.sleep(0)
        if any(i < 0 for i in items):
            if not self.one_by_one(batch):
                batch[0].future.set_exception(ValueError(items[0]))
            return
        for entry in batch:
            entry.future.set_result(entry.item * 10)


async def test_a_refused_batch_goes_again_one_call_per_statement() -> None:
    picky = Picky()
    results = await asyncio.gather(*(picky.submit(i) for i in (1, -2, 3)),
                                   return_exceptions=True)
    assert results[0] == 10 and results[2] == 30 and isinstance(results[1], ValueError)
    assert picky.batches == [[1, -2, 3], [1], [-2], [3]]


class Stuck(GroupCommit[int, int]):
    """A statement that never comes back."""

    def __init__(self) -> None:
        super().__init__(max_in_flight=1)
        self.left: list[int] = []

    async def _send(self, batch: list[Entry[int, int]]) -> None:
        await asyncio.Event().wait()

    def _left(self, entry: Entry[int, int]) -> None:
        self.left.append(entry.item)
        super()._left(entry)


async def test_close_ends_what_is_out_and_hands_back_every_unanswered_call() -> None:
    stuck = Stuck()
    out = stuck.submit(1)
    await asyncio.sleep(0)  # the first statement is out; the next calls wait for it
    queued = [stuck.submit(2), stuck.submit(3)]
    stuck.requeue([Entry(4, asyncio.get_running_loop().create_future(), 0.0)], after=3600)
    await stuck.close(0.01)
    assert sorted(stuck.left) == [1, 2, 3, 4]
    assert out.cancelled() and all(f.cancelled() for f in queued)
    assert [t for t in asyncio.all_tasks()
            if t.get_coro().__qualname__.startswith("GroupCommit.")] == []
