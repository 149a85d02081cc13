"""Review 4: a freed key whose record does not land (gateway/ledger.py,
``Ledger.finish``: commit c6e9a05 made the "free" path swallow any
exception).

The provider answered 503 (it did nothing): the gateway frees the key and
tells the caller "the key is free again". If the database refuses the free
(here a trigger, as any refusal would), the record is given up, the key
reads in flight and then unknown, yet the caller is still told it is free;
its retry is refused 409, then needs an operator. Nothing is sent twice;
the answer is what is wrong: it should say the outcome is not recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tests.integration.conftest import Gw


async def test_a_free_that_did_not_land_is_not_answered_free(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    gw = await make_gw()
    await gw.pool.execute("""
        CREATE FUNCTION review4_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
        CREATE TRIGGER review4_refuse BEFORE DELETE ON fencegate_effects FOR EACH ROW
          WHEN (OLD.idempotency_key = 'refused') EXECUTE FUNCTION review4_refuse();""")
    lease = await gw.leases.claim("run:free", ttl=60)
    assert lease is not None
    gw.hook.status = 503
    status, _, body = await gw.post("/v1/http/hook/x", gw.headers(lease, "refused"),
                                    json={"n": 1})
    assert len(gw.hook.deliveries) == 1
    await asyncio.sleep(0.2)
    # the free did not land: the key is not free
    assert await gw.effect_state("refused") == "in_flight"
    gw.hook.status = 200
    again, _, _ = await gw.post("/v1/http/hook/x", gw.headers(lease, "refused"), json={"n": 1})
    assert again == 409 and len(gw.hook.deliveries) == 1  # the "free" key is not free
    # ... so the first answer must not have said it was
    assert "free" not in str(body.get("detail", "")), (status, body)
