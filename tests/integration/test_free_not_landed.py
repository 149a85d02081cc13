"""Review 5: answers given when the record that frees a key did not land
(gateway/effects.py ``run``, ``_not_freed``; commits 43464f2, 3cb73cb).

43464f2 made ``Ledger.finish`` say (False) when a "free" did not land, and
``run`` then answers through ``_not_freed`` ("the key may not be
released"). Two gaps remain:

- the configured-rate refusal (``rate_limit_per_second``) frees the key it
  admitted through the same ``end("free", ...)`` but ignores what it returns:
  its 429 ``rate_limited`` with ``reason: configured_rate`` means, by
  docs/gateway.md ("Answers"), "the key is free again", yet the key reads in
  flight: the caller's retry after ``Retry-After`` is refused 409, then
  needs an operator;
- ``_not_freed`` rebuilds the problem from the code and ``Retry-After``
  only, dropping the fields the provider's answer carried
  (``provider_status``, which docs/gateway.md promises on 502
  ``provider_error`` "when there was one"): a caller can no longer tell a
  provider's 429 from its 503, though docs/gateway.md says the answer "keeps
  its status and code"."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tests.integration.conftest import Gw

REFUSE_FREE = """
    CREATE FUNCTION review5_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
    CREATE TRIGGER review5_refuse BEFORE DELETE ON fencegate_effects FOR EACH ROW
      WHEN (OLD.idempotency_key = 'refused') EXECUTE FUNCTION review5_refuse();"""


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
    await asyncio.sleep(0.2)
    assert await gw.effect_state("refused") == "in_flight"  # the free did not land
    again, _, body2 = await gw.post("/v1/http/hook/x", gw.headers(lease, "refused"),
                                    json={"n": 2})
    assert again == 409 and body2.get("code") == "effect_in_progress"  # not free
    # ... so the 429 must not have read "the key is free again", as the same
    # failed free after a provider's 503 does not (_not_freed)
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
    await asyncio.sleep(0.2)
    assert await gw.effect_state("refused") == "in_flight"  # the free did not land
    assert (status, body.get("code")) == (502, "provider_error"), body
    assert "released" in str(body.get("detail", "")), body  # _not_freed answered
    # same status and code, and the provider's status with them (docs/gateway.md)
    assert body.get("provider_status") == 503, f"_not_freed dropped provider_status: {body}"
