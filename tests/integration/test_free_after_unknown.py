"""Review 5: a "free" that lands as ``unknown`` is answered "the key is free
again" (gateway/ledger.py ``Ledger.finish``, gateway/effects.py ``run``;
commit 43464f2 made ``finish`` answer whether the free landed).

A key whose first attempt's outcome is unknown is admitted again inside a
deduping provider's window (``attempts`` 2). If that attempt's provider
answers 503 (this attempt did nothing), ``fencegate_finish_effect`` does not
free the key: it records it ``unknown`` ('unknown', since the first attempt
may have landed). ``OutcomeWriter._landed`` settles the record's future
whatever ``done`` says, so ``finish`` returns True and the caller gets the
plain not-acted answer: 502 ``provider_error``, "the key is free again",
which docs/gateway.md reads as "the provider certainly did not act". The
effect may well have happened (the first attempt reached the provider); a
caller that believes the answer and does it again under a new key sends it
twice."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.integration.conftest import Gw


async def test_a_free_recorded_as_unknown_is_not_answered_free(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    gw = await make_gw(providers={"crm": {"resend_attempts": 0}})
    lease = await gw.leases.claim("run:twice", ttl=60)
    assert lease is not None
    gw.hook.status = 500  # may have acted: unknown
    status, _, body = await gw.post("/v1/http/crm/contacts", gw.headers(lease, "k"),
                                    json={"n": 1})
    assert (status, body.get("code")) == (502, "provider_outcome_unknown"), body
    assert await gw.effect_state_after("k") == "unknown"

    gw.hook.status = 503  # this attempt did nothing; the first one may have
    status, _, body = await gw.post("/v1/http/crm/contacts", gw.headers(lease, "k"),
                                    json={"n": 1})
    assert len(gw.hook.deliveries) == 2  # admitted again inside the window
    state = await gw.pool.fetchval("SELECT state FROM fencegate_effects "
                                   "WHERE idempotency_key = 'k'")
    assert state == "unknown"  # the ledger did not free it
    assert "free again" not in str(body.get("detail", "")), (
        f"answered as if nothing happened and the key were free, but it reads {state}: "
        f"{status} {body}")
