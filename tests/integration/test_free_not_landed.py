"""Answers given when the record that frees a key does not land.

When the provider certainly did not act but the database refuses the record
that frees the key (here a trigger, as any refusal would), the key reads in
flight and then unknown, so the answer never says "the key is free again":
it says the key may not be released, and it keeps the status, code and
fields (``provider_status``) the provider's answer carried."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.integration.conftest import Gw

REFUSE_FREE = """
    CREATE FUNCTION refuse_free() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
    CREATE TRIGGER refuse_free BEFORE DELETE ON fencegate_effects FOR EACH ROW
      WHEN (OLD.idempotency_key = 'refused') EXECUTE FUNCTION refuse_free();"""


async def test_a_free_that_did_not_land_is_not_answered_free(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    gw = await make_gw()
    await gw.pool.execute(REFUSE_FREE)
    lease = await gw.leases.claim("run:free", ttl=60)
    assert lease is not None
    gw.hook.status = 503
    status, _, body = await gw.post("/v1/http/hook/x", gw.headers(lease, "refused"),
                                    json={"n": 1})
    assert len(gw.hook.deliveries) == 1
    await gw.gateway.ledger.drain()  # nothing left to record
    # the free did not land: the key is not free
    assert await gw.effect_state("refused") == "in_flight"
    gw.hook.status = 200
    again, _, _ = await gw.post("/v1/http/hook/x", gw.headers(lease, "refused"), json={"n": 1})
    assert again == 409 and len(gw.hook.deliveries) == 1  # the "free" key is not free
    # ... so the first answer must not have said it was
    assert "free" not in str(body.get("detail", "")), (status, body)


async def test_a_configured_rate_refusal_whose_free_did_not_land_is_not_answered_free(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    # one token, refilled once a minute: the second request is over the rate
    gw = await make_gw(providers={"hook": {"rate_limit_per_second": 1 / 60}})
    await gw.pool.execute(REFUSE_FREE)
    lease = await gw.leases.claim("run:rate", ttl=60)
    assert lease is not None
    status, _, _ = await gw.post("/v1/http/hook/x", gw.headers(lease, "first"), json={"n": 1})
    assert status == 200 and len(gw.hook.deliveries) == 1

    status, _, body = await gw.post("/v1/http/hook/x", gw.headers(lease, "refused"),
                                    json={"n": 2})
    assert (status, body.get("code"), body.get("reason")) == \
        (429, "rate_limited", "configured_rate"), body
    assert len(gw.hook.deliveries) == 1  # nothing sent
    await gw.gateway.ledger.drain()  # nothing left to record
    assert await gw.effect_state("refused") == "in_flight"  # the free did not land
    again, _, body2 = await gw.post("/v1/http/hook/x", gw.headers(lease, "refused"),
                                    json={"n": 2})
    assert again == 409 and body2.get("code") == "effect_in_progress"  # not free
    # ... so the 429 must not read "the key is free again", as the same
    # failed free after a provider's 503 does not
    assert "released" in str(body.get("detail", "")), (
        "429 configured_rate (docs: the key is free again) though the free did not "
        f"land: {body}")


async def test_a_free_that_did_not_land_keeps_the_providers_status(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    gw = await make_gw()
    lease = await gw.leases.claim("run:status", ttl=60)
    assert lease is not None
    gw.hook.status = 503
    status, _, landed = await gw.post("/v1/http/hook/x", gw.headers(lease, "landed"),
                                      json={"n": 1})
    assert (status, landed.get("code"), landed.get("provider_status")) == \
        (502, "provider_error", 503), landed  # the free landed: provider_status is there

    await gw.pool.execute(REFUSE_FREE)
    status, _, body = await gw.post("/v1/http/hook/x", gw.headers(lease, "refused"),
                                    json={"n": 1})
    assert len(gw.hook.deliveries) == 2
    await gw.gateway.ledger.drain()  # nothing left to record
    assert await gw.effect_state("refused") == "in_flight"  # the free did not land
    assert (status, body.get("code")) == (502, "provider_error"), body
    assert "released" in str(body.get("detail", "")), body  # the not-freed answer
    # same status and code, and the provider's status with them (docs/gateway.md)
    assert body.get("provider_status") == 503, f"the answer dropped provider_status: {body}"
