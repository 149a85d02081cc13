"""The drain barrier against the gateway's own delays, and the end of each
attempt counted once (issues 9 and 18).

No effect of fence F may reach a provider after fence F+1 was granted. Each
test here reproduces a way that broke: the wait for an SMTP connection, a
slow database answer, a finish retried after its first try committed; and
two ways a key got stuck or sent twice: an operator's resolve during a slot
wait, an admission whose answer was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.effects.fingerprint import message_id
from leases import Lease, LeaseClient, sql
from tests.integration.conftest import Gw
from tests.support.faultproxy import FaultProxy
from tests.support.lapse import lapse
from tests.support.waiting import until


@pytest.fixture
async def proxy(dsn: str) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy(dsn).start()
    yield p
    await p.close()


async def _warm(gw: Gw, lease: Lease) -> None:
    """One effect first, then the admission prepared on every connection of
    the gateway's pool: each later statement is one round trip, and a fault on
    the link strikes the statement itself rather than its preparation. (Only
    warming the connection used last was not enough: the purge loop's first
    pass could be the last to hand its connection back, and the admission then
    took two delayed round trips.)"""
    status, _, _ = await gw.request("POST", "/v1/http/hook/warm", gw.headers(lease, "warm-up"),
                                    json={})
    assert status == 200
    # the record is written behind the answer: let it land
    assert await gw.effect_state_after("warm-up") == "succeeded"
    pool = gw.gateway.pool
    held = [await pool.acquire() for _ in range(pool.get_size())]
    try:
        for conn in held:  # a resource with no lease: verdict no_lease, nothing written
            await conn.fetchrow(sql.query("admit_effect"), "warm", "warm", b"", "warm:none",
                                1, "hook", 1, 1.0, 0.0, 0.0, None)
    finally:
        for conn in held:
            await pool.release(conn)
    gw.hook.deliveries.clear()


async def _claim_while(b: LeaseClient, resource: str, running: asyncio.Task[object],
                       ttl: float = 30) -> float | None:
    """Keep claiming ``resource`` while ``running`` runs; when it was won."""
    while not running.done():
        if await b.claim(resource, ttl=ttl) is not None:
            return time.monotonic()
        await asyncio.sleep(0.02)
    return None


async def _admitted(gw: Gw, *keys: str) -> None:
    """Until the effects under ``keys`` are admitted (in the ledger)."""
    async def all_there() -> bool:
        return bool(await gw.pool.fetchval(
            "SELECT count(*) = $2 FROM fencegate_effects WHERE idempotency_key = ANY($1)",
            list(keys), len(keys)))

    await until(all_there, f"{len(keys)} effect(s) admitted")


async def _queue_emails(gw: Gw, n: int) -> list[asyncio.Task[object]]:
    """``n`` emails on resources of their own, admitted and queued for the
    SMTP connection."""
    tasks: list[asyncio.Task[object]] = []
    for i in range(n):
        lease = await gw.leases.claim(f"run:bg-{i}", ttl=60)
        assert lease is not None
        tasks.append(asyncio.create_task(gw.email(lease, f"bg-{i}")))
    await _admitted(gw, *(f"bg-{i}" for i in range(n)))
    return tasks


async def test_the_wait_for_an_smtp_connection_cannot_outrun_the_drain_barrier(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """One SMTP connection, five emails ahead of A's: A's email waits ~4 s
    for it, past A's 1 s lease and past the 3 s the database used to hold the
    barrier. B's claim must not win before A's email has landed (or was
    given up, nothing sent)."""
    gw = await make_gw(providers={"mail": {"pool_size": 1}})
    gw.smtp.data_delay = 0.8
    background = await _queue_emails(gw, 5)
    lease_a = await gw.leases.claim("run:A", ttl=60)
    assert lease_a is not None
    send_a = asyncio.create_task(gw.email(lease_a, "a-1"))
    await _admitted(gw, "a-1")
    await lapse(gw.pool, "run:A")  # A's lease runs out while its email waits
    won_at = await _claim_while(LeaseClient(pool=gw.pool, owner="worker-b"), "run:A", send_a)
    status, _, body = await send_a
    await asyncio.gather(*background)
    mine = [d for d in gw.smtp.deliveries
            if d.header("Message-ID") == message_id("agents", "a-1")]
    if won_at is not None:
        late = [round(d.received_at - won_at, 3) for d in mine if d.received_at >= won_at]
        assert not late, f"A's email landed {late} s after fence F+1 was granted"
    if status == 200:
        assert len(mine) == 1
    else:  # given up before sending: nothing went out, the key is free
        assert (status, body["code"]) == (503, "overloaded") and mine == []
    # once A's attempt has ended (its end recorded, behind the answer), the
    # barrier opens at once
    await until(lambda: gw.pool.fetchval("SELECT inflight = 0 FROM fencegate_leases "
                                         "WHERE resource = 'run:A'"), "A's end recorded")
    assert await LeaseClient(pool=gw.pool, owner="worker-b").claim("run:A", ttl=5) is not None


async def test_an_operator_cannot_resolve_an_effect_still_waiting_to_be_sent(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """A's email waits for the SMTP connection past the deadline the database
    used to record. An operator's `resolve not_sent` then freed the key, the
    caller's retry was sent, and so was the original: one Message-ID, two
    deliveries."""
    gw = await make_gw(providers={"mail": {"pool_size": 1}})
    gw.smtp.data_delay = 0.8
    background = await _queue_emails(gw, 8)  # 6.4 s of messages ahead of A's
    lease = await gw.leases.claim("run:A", ttl=60)
    assert lease is not None
    send_a = asyncio.create_task(gw.email(lease, "a-1"))
    await _admitted(gw, "a-1")
    # past the old deadline (1 s timeout + 2 s) by the database's clock
    await until(lambda: gw.pool.fetchval(
        "SELECT clock_timestamp() > created_at + interval '3.2 seconds' "
        "FROM fencegate_effects WHERE idempotency_key = 'a-1'"), "the old deadline passed")
    assert not send_a.done(), "A's email no longer waits: the test proves nothing"
    auth = {"Authorization": gw.headers()["Authorization"]}
    status, headers, body = await gw.post("/v1/effects/a-1/resolve", auth,
                                          json={"outcome": "not_sent"})
    assert (status, body["code"]) == (409, "effect_in_progress"), body
    assert int(headers["Retry-After"]) >= 1
    retry = await gw.email(lease, "a-1")
    assert (retry[0], retry[2]["code"]) == (409, "effect_in_progress")
    first = await send_a
    await asyncio.gather(*background)
    mine = [d for d in gw.smtp.deliveries
            if d.header("Message-ID") == message_id("agents", "a-1")]
    assert len(mine) <= 1, "one Message-ID, two deliveries"
    if first[0] == 200:
        assert len(mine) == 1
    elif first[2]["code"] != "provider_timeout":  # given up before sending
        assert mine == [], first
    # else unknown: on a busy machine the sink's answer to DATA can come
    # after the provider's timeout; the message may have landed, once


async def test_a_slow_database_answer_cannot_outrun_the_drain_barrier(
    make_gw: Callable[..., Awaitable[Gw]], proxy: FaultProxy,
) -> None:
    """Every packet between gateway and database takes 2.4 s: the admission's
    answer comes back after the deadline the database gave the attempt under
    the old rule (provider timeout + 2 s from its own clock). The send that
    follows must still fall inside the barrier."""
    gw = await make_gw(proxy.dsn(), database_timeout_seconds=8,
                       providers={"hook": {"timeout_seconds": 0.05}})
    lease_a = await gw.leases.claim("run:A", ttl=60)
    assert lease_a is not None
    await _warm(gw, lease_a)
    proxy.delay_seconds = 2.4
    proxy.set_mode("delay")
    send_a = asyncio.create_task(gw.request("POST", "/v1/http/hook/x",
                                            gw.headers(lease_a, "slow-db"), json={}))
    await _admitted(gw, "slow-db")  # the admission has landed; its answer is on its way
    await lapse(gw.pool, "run:A")  # and the lease has run out
    won_at = await _claim_while(LeaseClient(pool=gw.pool, owner="worker-b"), "run:A", send_a)
    status, _, _ = await send_a
    assert status == 200
    assert len(gw.hook.deliveries) == 1
    if won_at is not None:
        landed = gw.hook.deliveries[0].received_at
        assert landed < won_at, (
            f"A's request landed {landed - won_at:.3f} s after fence F+1 was granted")


async def test_a_finish_retried_after_its_first_try_committed_holds_the_barrier(
    make_gw: Callable[..., Awaitable[Gw]], proxy: FaultProxy,
) -> None:
    """Two effects in flight under F: A (fast) and B (slow). A's finish
    commits, but its answer comes back after the gateway stopped waiting; the
    gateway records it again a second later. Counted twice, that released B's
    place in the barrier too: C was granted F+1 while B was still on its way,
    and B landed after."""
    gw = await make_gw(proxy.dsn(), database_timeout_seconds=0.5,
                       providers={"mail": {"timeout_seconds": 9}})
    lease = await gw.leases.claim("run:R", ttl=60)
    assert lease is not None
    await _warm(gw, lease)
    # B's message comes 6.5 s after its admission: after A's finish, its late
    # answer, and the retry a second later
    gw.smtp.envelope_delay = 6.5
    send_b = asyncio.create_task(gw.email(lease, "slow-b"))
    await _admitted(gw, "slow-b")  # B is admitted, and goes on to its envelope
    proxy.delay_seconds = 1.0
    gw.hook.on_request = lambda _: proxy.set_mode("delay")  # A's finish: answered late
    status_a, _, _ = await gw.request("POST", "/v1/http/hook/x", gw.headers(lease, "fast-a"),
                                      json={})
    assert status_a == 200
    proxy.set_mode("pass")
    await lapse(gw.pool, "run:R")  # the lease runs out; B is still on its way
    won_at = await _claim_while(LeaseClient(pool=gw.pool, owner="worker-c"), "run:R", send_b)
    status_b, _, _ = await send_b
    assert status_b == 200
    [b] = gw.smtp.deliveries
    if won_at is not None:
        assert b.received_at < won_at, (
            f"B landed {b.received_at - won_at:.3f} s after fence F+1 was granted")
    # both ends recorded (some perhaps in the background), each counted once
    states: dict[str, str] = {}
    inflight = None

    async def recorded() -> bool:
        nonlocal states, inflight
        states = {r[0]: r[1] for r in await gw.pool.fetch(
            "SELECT idempotency_key, state FROM fencegate_effects WHERE fence = $1",
            lease.fence)}
        inflight = await gw.pool.fetchval(
            "SELECT inflight FROM fencegate_leases WHERE resource = 'run:R'")
        return set(states.values()) == {"succeeded"} and inflight == 0

    with contextlib.suppress(AssertionError):  # told below
        await until(recorded, "both ends recorded")
    assert states == {"warm-up": "succeeded", "fast-a": "succeeded", "slow-b": "succeeded"}
    assert inflight == 0


async def test_an_admission_whose_answer_was_lost_does_not_leave_the_key_stuck(
    make_gw: Callable[..., Awaitable[Gw]], proxy: FaultProxy,
) -> None:
    """The admission committed, its answer never came back: the caller got
    503, nothing was sent. The key used to stay in flight, then unknown (409
    effect_outcome_unknown for ever after), holding the barrier; the gateway
    now frees it by the attempt's nonce."""
    gw = await make_gw(proxy.dsn(), database_timeout_seconds=0.5)
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    await _warm(gw, lease)
    # a witness that the admission did commit, though its answer was lost
    await gw.pool.execute("""
        CREATE TABLE test_admitted (key text);
        CREATE FUNCTION test_witness() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO test_admitted VALUES (NEW.idempotency_key); RETURN NULL; END $$;
        CREATE TRIGGER test_witness AFTER INSERT ON fencegate_effects
            FOR EACH ROW EXECUTE FUNCTION test_witness();""")
    proxy.set_mode("lose_replies")
    status, _, body = await gw.email(lease, "lost-answer")
    assert (status, body["code"]) == (503, "unavailable")
    proxy.set_mode("pass")
    assert await gw.pool.fetchval("SELECT count(*) FROM test_admitted "
                                  "WHERE key = 'lost-answer'") == 1
    left = inflight = None

    async def freed() -> bool:
        nonlocal left, inflight
        left = await gw.pool.fetchval(
            "SELECT count(*) FROM fencegate_effects WHERE idempotency_key = 'lost-answer'")
        inflight = await gw.pool.fetchval(
            "SELECT inflight FROM fencegate_leases WHERE resource = 'run:1'")
        return left == 0 and inflight == 0

    with contextlib.suppress(AssertionError):  # told below
        await until(freed, "the key freed by the attempt's nonce")
    assert (left, inflight) == (0, 0)
    assert gw.smtp.deliveries == []
    status, _, body = await gw.email(lease, "lost-answer")
    assert status == 200, body
    assert len(gw.smtp.deliveries) == 1
