"""The outcome writer behind the answer records what it can: an answer whose
header is not UTF-8 (a legacy server's Latin-1 ``Content-Disposition``) is
recorded and replayed, and a record the database refuses fails alone, without
losing the records batched with it or ending the writer."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import asyncpg

from tests.integration.conftest import Gw
from tests.support.legacy_peer import (  # noqa: F401
    LegacyPeer,
    legacy,
    legacy_gateway,
)
from tests.support.waiting import until


async def test_an_answer_with_latin1_header_is_recorded_and_replayed(
    make_gw: Callable[..., Awaitable[Gw]], legacy: LegacyPeer,  # noqa: F811
) -> None:
    gw = await legacy_gateway(make_gw, legacy)
    lease = await gw.leases.claim("run:latin1", ttl=60)
    assert lease is not None

    status, _, body = await gw.post("/v1/http/legacy/doc", gw.headers(lease, "latin1"),
                                    json={"n": 1})
    assert legacy.requests == 1
    assert status == 200, body

    # the record lands behind the answer
    state = await gw.effect_state_after("latin1")
    assert state == "succeeded", "the provider answered 200; the record never landed"

    # a repeat in the same process is the replay (docs/gateway.md), nothing sent
    status, headers, _ = await gw.post("/v1/http/legacy/doc", gw.headers(lease, "latin1"),
                                       json={"n": 1})
    assert (status, headers.get("Idempotent-Replayed")) == (200, "true")
    assert legacy.requests == 1


async def test_one_unrecordable_answer_does_not_lose_the_records_batched_with_it(
    make_gw: Callable[..., Awaitable[Gw]], legacy: LegacyPeer,  # noqa: F811
) -> None:
    """The writer's statement for effect A is held up (its lease row is
    locked elsewhere for a moment); meanwhile the latin-1 answer and an
    ordinary webhook's answer gather into the next batch. The ordinary one's
    record must land: its caller had a 200, a repeat must be the replay."""
    gw = await legacy_gateway(make_gw, legacy)
    held, poison, innocent = [await gw.leases.claim(f"run:{n}", ttl=60)
                              for n in ("held", "poison", "innocent")]
    assert held is not None and poison is not None and innocent is not None

    locker = await gw.pool.acquire()
    tx = locker.transaction()
    try:
        # the lock is taken once A is admitted, before A's record is written
        gw.hook.before_answer = lambda _: _lock_held_row(locker, tx)
        status, _, _ = await gw.post("/v1/http/hook/a", gw.headers(held, "a"), json={"n": 1})
        assert status == 200 and locker.is_in_transaction()
        gw.hook.before_answer = None

        status, _, _ = await gw.post("/v1/http/legacy/doc", gw.headers(poison, "poison"),
                                     json={"n": 1})
        assert status == 200
        status, _, _ = await gw.post("/v1/http/hook/b", gw.headers(innocent, "innocent"),
                                     json={"n": 2})
        assert status == 200
    finally:
        await tx.rollback()
        await gw.pool.release(locker)

    state = await gw.effect_state_after("innocent")
    assert state == "succeeded", "an ordinary 200's record was lost with the batch"


async def test_a_record_the_database_refuses_fails_alone_and_the_writer_lives_on(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """Any record PostgreSQL refuses (here a trigger refuses one effect's
    end, as a constraint would) fails alone: the records batched with it
    land, the refused effect stays in flight (then unknown, never sent
    again), and later records still land."""
    gw = await make_gw()
    await gw.pool.execute("""
        CREATE FUNCTION refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
        CREATE TRIGGER refuse_update BEFORE UPDATE ON fencegate_effects FOR EACH ROW
          WHEN (NEW.idempotency_key = 'refused' AND OLD.state = 'in_flight'
                AND NEW.state <> 'in_flight')
          EXECUTE FUNCTION refuse_update();""")
    try:
        held, refused, innocent, later = [await gw.leases.claim(f"run:{n}", ttl=60)
                                          for n in ("held", "refused", "innocent", "later")]
        assert held and refused and innocent and later
        locker = await gw.pool.acquire()
        tx = locker.transaction()
        try:  # A's record waits for the row lock; the next two gather behind it
            gw.hook.before_answer = lambda _: _lock_held_row(locker, tx)
            status, _, _ = await gw.post("/v1/http/hook/a", gw.headers(held, "a"),
                                         json={"n": 1})
            assert status == 200 and locker.is_in_transaction()
            gw.hook.before_answer = None
            for lease, key in ((refused, "refused"), (innocent, "innocent")):
                status, _, _ = await gw.post("/v1/http/hook/x", gw.headers(lease, key),
                                             json={"n": 2})
                assert status == 200
        finally:
            await tx.rollback()
            await gw.pool.release(locker)

        states = await _states_once_landed(gw, ("a", "innocent"))
        assert states == {"a": "succeeded", "innocent": "succeeded"}
        status, _, _ = await gw.post("/v1/http/hook/x", gw.headers(later, "later"),
                                     json={"n": 3})
        assert status == 200
        assert await _states_once_landed(gw, ("later",)) == {"later": "succeeded"}
        assert await gw.pool.fetchval("SELECT state FROM fencegate_effects "
                                      "WHERE idempotency_key = 'refused'") == "in_flight"
        # its repeat is not sent again
        status, _, body = await gw.post("/v1/http/hook/x", gw.headers(refused, "refused"),
                                        json={"n": 2})
        assert (status, body["code"]) == (409, "effect_in_progress")
        assert [d.path for d in gw.hook.deliveries].count("/hook/x") == 3
    finally:
        await gw.pool.execute("DROP TRIGGER refuse_update ON fencegate_effects; "
                              "DROP FUNCTION refuse_update()")


async def _lock_held_row(locker: asyncpg.Connection,
                         tx: asyncpg.transaction.Transaction) -> None:
    await tx.start()
    await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = 'run:held' "
                         "FOR NO KEY UPDATE")


async def _states_once_landed(gw: Gw, keys: tuple[str, ...]) -> dict[str, str]:
    states: dict[str, str] = {}

    async def landed() -> bool:
        nonlocal states
        states = {r[0]: r[1] for r in await gw.pool.fetch(
            "SELECT idempotency_key, state FROM fencegate_effects "
            "WHERE idempotency_key = ANY($1::text[])", list(keys))}
        return len(states) == len(keys) and "in_flight" not in states.values()

    with contextlib.suppress(AssertionError):  # the caller says what it expected
        await until(landed, f"the records of {keys}")
    return states
