"""The job platform's demo scenario, shared by ``fencegate demo queue`` and
the console's playground: charges on a queue, run by a ``Worker`` whose
handler charges through the gateway, a flaky job, a poison job and its fix.

- a **charge** is sent to the ``crm`` provider of the dev stack (its webhook
  sink stands in for a payments API) under the job's lease, with the
  idempotency key ``<queue>-charge-<order>``; enqueued with the dedupe key
  ``charge-<order>``, so the same charge delivered twice is one job;
- a **flaky** job fails its first ``FLAKY_FAILURES`` attempts (a timeout),
  then succeeds: the queue retries it on its own;
- a **poison** job fails every attempt until ``fix()``: it goes to the dead
  letters, and a replay after the fix completes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.client import GatewayClient
from gateway.dev.sinks import WebhookSink
from leases import Job, LeaseClient, Queue, RetryPolicy, Worker
from leases.queue import Enqueued, NewJob

#: the attempts a flaky job fails before it succeeds, and every job's attempts
FLAKY_FAILURES = 2
MAX_ATTEMPTS = 3
#: short backoffs: a demo shows retries within a second
RETRY = RetryPolicy(max_attempts=MAX_ATTEMPTS, base_seconds=0.2, cap_seconds=0.4)
#: the payments provider of the dev configuration (its webhook sink)
PROVIDER = "crm"
#: an event of the scenario: (who, what), in the order it happened
Say = Callable[[str, str], None]


@dataclass
class Charges:
    """A queue of demo jobs and the handler that runs them."""

    client: LeaseClient
    gateway: GatewayClient
    queue: Queue
    say: Say = field(default=lambda who, what: None)
    #: the poison job's bug: fixed by ``fix()``
    fixed: bool = False
    #: the order of the latest ``charge()``
    last_order: int | None = None
    _orders: itertools.count[int] = field(default_factory=lambda: itertools.count(1001))

    async def handle(self, job: Job) -> str | None:
        kind = job.payload.get("kind")
        attempt = f"job {job.id} ({kind}, attempt {job.attempts} of {job.max_attempts})"
        if kind == "charge":
            order, cents = job.payload["order"], job.payload["amount_cents"]
            # the gateway's key: per run, as an idempotency key belongs to the
            # first resource it was admitted under (another run's job is another)
            sent = await self.gateway.request(
                job.lease, f"{self.queue.name}-charge-{order}", PROVIDER, "POST", "/charges",
                json={"order": order, "amount_cents": cents})
            self.say("worker", f"{attempt}: charges order {order} ${cents / 100:.2f} through "
                     f"the gateway: {sent.status}{' (replayed)' if sent.replayed else ''}")
            return f"charge-{order}"
        if kind == "flaky" and job.attempts <= FLAKY_FAILURES:
            self.say("worker", f"{attempt}: the card network times out: fails, the queue "
                     "will retry it")
            raise ConnectionError("the card network timed out")
        if kind == "poison" and not self.fixed:
            self.say("worker", f"{attempt}: crashes on its payload (amount "
                     f"{job.payload['amount']!r})")
            raise ValueError(f"amount {job.payload['amount']!r} is not a number of cents")
        self.say("worker", f"{attempt}: done")
        return None

    async def charge(self) -> Enqueued:
        """Enqueue a charge for a new order (``last_order``)."""
        self.last_order = next(self._orders)
        return await self.duplicate(self.last_order)

    async def duplicate(self, order: int) -> Enqueued:
        """Enqueue the charge of ``order`` (again: the same dedupe key)."""
        [done] = await self.queue.enqueue_reporting([NewJob(
            {"kind": "charge", "order": order, "amount_cents": 1000},
            dedupe_key=f"charge-{order}")])
        return done

    async def flaky(self) -> int:
        return await self.queue.enqueue({"kind": "flaky"})

    async def poison(self) -> int:
        return await self.queue.enqueue({"kind": "poison", "amount": "ten dollars"})

    def fix(self) -> None:
        """Deploy the fix for the poison job's bug."""
        self.fixed = True

    async def replay(self, job_ids: list[int] | None = None) -> int:
        """Dead jobs (``job_ids``, or all of this queue's) back to the queue."""
        return await self.queue.replay(job_ids)

    async def state(self, job_id: int) -> str | None:
        row = await self.client.fetchrow("show_job", job_id)
        return None if row is None else str(row["state"])

    async def until_state(self, job_id: int, *states: str, seconds: float = 60.0) -> str:
        """Wait for job ``job_id`` to reach one of ``states``; the one it
        reached, or the one it is still in after ``seconds``."""
        deadline = time.monotonic() + seconds
        while (now := await self.state(job_id)) not in states and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return str(now)


def new_queue_name() -> str:
    """A queue of its own per run, so runs never see each other's jobs."""
    return f"demo-charges-{secrets.token_hex(3)}"


@contextlib.asynccontextmanager
async def running(dsn: str, url: str, api_key: str, queue_name: str,
                  say: Say) -> AsyncIterator[Charges]:
    """The scenario's queue with a worker running its handler, until exit:
    on the database ``dsn``, charging through the gateway at ``url``."""
    async with LeaseClient(dsn, owner=f"worker-{queue_name}") as client, \
            GatewayClient(url, api_key) as gateway:
        charges = Charges(client, gateway, Queue(client, queue_name, retry=RETRY), say)
        worker = Worker(charges.queue, charges.handle, concurrency=2, ttl=10.0,
                        poll_min=0.01, poll_max=0.1)
        task = asyncio.create_task(worker.run())
        try:
            yield charges
        finally:
            worker.stop()
            await task


def charges_received(sink: WebhookSink, order: int | None = None) -> int:
    """How many charge requests (for ``order``, or any) reached the payments sink."""
    found = 0
    for d in sink.deliveries:
        if not d.path.endswith("/charges"):
            continue
        try:
            body = json.loads(d.body)
        except ValueError:
            continue
        found += order is None or (isinstance(body, dict) and body.get("order") == order)
    return found


def describe(payload: dict[str, Any]) -> str:
    """A job's payload as the playground lists it."""
    kind = payload.get("kind", "?")
    if kind == "charge":
        return f"charge order {payload.get('order')}"
    return str(kind)
