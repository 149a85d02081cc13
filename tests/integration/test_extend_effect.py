"""``fencegate_extend_effect`` on PostgreSQL: the one statement a resend must
pass. It moves an attempt's deadline and its lease's drain barrier together,
and only while the fence is current, its lease live, the attempt still in
flight under its nonce, and the provider's window covers the new attempt."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from gateway.ledger import RESEND_MARGIN_SECONDS, Ledger, new_attempt
from leases import Lease, LeaseClient

WINDOW = 86400.0


@dataclass
class Admitted:
    ledger: Ledger
    lease: Lease
    attempt: int
    key: str = "k1"

    async def extend(self, deadline_seconds: float = 10.0, *, attempt: int | None = None,
                     fence: int | None = None) -> str:
        return await self.ledger.extend(
            "agents", self.key, self.attempt if attempt is None else attempt,
            self.lease.resource, self.lease.fence if fence is None else fence,
            deadline_seconds)


@pytest.fixture
async def admitted(pool: asyncpg.Pool) -> AsyncIterator[Admitted]:
    """One effect admitted on run:1 (a 2 s deadline, a day's window), its
    attempt in flight as after a timeout: not finished."""
    leases = LeaseClient(pool=pool, owner="worker-a", timeout=5)
    lease = await leases.claim("run:1", ttl=30)
    assert lease is not None
    ledger = Ledger(leases)
    attempt = new_attempt()
    admission = await ledger.admit("agents", "k1", b"fp", "run:1", lease.fence, "resend",
                                   attempt, 2.0, WINDOW)
    assert admission.verdict == "admitted"
    yield Admitted(ledger, lease, attempt)
    await ledger.drain()


async def _rows(pool: asyncpg.Pool) -> tuple[asyncpg.Record, asyncpg.Record]:
    effect = await pool.fetchrow("SELECT state, attempts, attempt, deadline, retry_until "
                                 "FROM fencegate_effects WHERE idempotency_key = 'k1'")
    lease = await pool.fetchrow("SELECT fence, inflight, drain_until FROM fencegate_leases "
                                "WHERE resource = 'run:1'")
    assert effect is not None and lease is not None
    return effect, lease


async def test_an_extension_moves_the_deadline_and_the_barrier_together(
        pool: asyncpg.Pool, admitted: Admitted) -> None:
    before, _ = await _rows(pool)
    now: dt.datetime = await pool.fetchval("SELECT clock_timestamp()")
    assert await admitted.extend(60.0) == "extended"
    effect, lease = await _rows(pool)
    assert effect["deadline"] >= now + dt.timedelta(seconds=60) > before["deadline"]
    assert lease["drain_until"] == effect["deadline"]
    # the same attempt, counted once in the barrier, one more send of it
    assert (effect["state"], effect["attempt"], effect["attempts"]) == \
        ("in_flight", admitted.attempt, 2)
    assert lease["inflight"] == 1
    # a claim waits for it, even by the lease's own holder
    assert await admitted.lease.client.claim("run:1", ttl=30) is None


async def test_an_extension_never_shortens_the_deadline(
        pool: asyncpg.Pool, admitted: Admitted) -> None:
    before, lease_before = await _rows(pool)
    assert await admitted.extend(0.1) == "extended"
    effect, lease = await _rows(pool)
    assert effect["deadline"] == before["deadline"]
    assert lease["drain_until"] == lease_before["drain_until"]


async def test_no_extension_under_a_newer_fence(pool: asyncpg.Pool, admitted: Admitted) -> None:
    await pool.execute("UPDATE fencegate_leases SET drain_until = clock_timestamp() "
                       "WHERE resource = 'run:1'")  # as if the first deadline had passed
    newer = await admitted.lease.client.claim("run:1", ttl=30)
    assert newer is not None and newer.fence > admitted.lease.fence
    before, _ = await _rows(pool)
    assert await admitted.extend() == "stale_fence"
    assert (await _rows(pool))[0] == before


async def test_no_extension_once_the_lease_is_released(
        pool: asyncpg.Pool, admitted: Admitted) -> None:
    assert await admitted.lease.release()
    before, _ = await _rows(pool)
    assert await admitted.extend() == "lease_expired"
    assert (await _rows(pool))[0] == before


async def test_no_extension_for_another_attempt_or_a_finished_one(
        pool: asyncpg.Pool, admitted: Admitted) -> None:
    assert await admitted.extend(attempt=new_attempt()) == "not_in_flight"
    assert await admitted.extend(fence=admitted.lease.fence - 1) == "stale_fence"
    admitted.ledger.finish("agents", "k1", admitted.attempt, "run:1", "unknown", None,
                           "http timeout")
    await admitted.ledger.drain()
    assert (await _rows(pool))[0]["state"] == "unknown"
    assert await admitted.extend() == "not_in_flight"


async def test_no_extension_past_the_providers_window(
        pool: asyncpg.Pool, admitted: Admitted) -> None:
    """The admission's rule: the whole new attempt, and the margin for the
    two clocks, must end inside the window counted from the first admission."""
    effect, _ = await _rows(pool)
    left: float = await pool.fetchval(
        "SELECT extract(epoch FROM retry_until - clock_timestamp())::float8 "
        "FROM fencegate_effects WHERE idempotency_key = 'k1'")
    assert await admitted.extend(left - RESEND_MARGIN_SECONDS + 60) == "outside_window"
    assert (await _rows(pool))[0] == effect
    assert await admitted.extend(left - RESEND_MARGIN_SECONDS - 60) == "extended"
