"""A free that comes to ``unknown`` is never answered "the key is free again".

A key whose first attempt's outcome is unknown may be admitted again inside a
deduping provider's window (``attempts`` 2). When that attempt certainly did
nothing (the provider's 503, or the configured rate refusing it before it is
sent), the ledger records the key ``unknown``, not free, since the first
attempt may have acted; the answer then says the outcome is unknown, so a
caller does not do the effect again under a new key."""

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


async def test_a_configured_rate_refusal_whose_free_came_to_unknown_says_unknown(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    # one token, refilled once a minute: the repeat is over the rate
    gw = await make_gw(providers={"crm": {"resend_attempts": 0,
                                          "rate_limit_per_second": 1 / 60}})
    lease = await gw.leases.claim("run:rate-unknown", ttl=60)
    assert lease is not None
    gw.hook.status = 500  # may have acted: unknown
    status, _, body = await gw.post("/v1/http/crm/contacts", gw.headers(lease, "k"),
                                    json={"n": 1})
    assert (status, body.get("code")) == (502, "provider_outcome_unknown"), body
    assert await gw.effect_state_after("k") == "unknown"

    # the repeat is admitted again inside the window, then refused by the rate
    status, headers, body = await gw.post("/v1/http/crm/contacts", gw.headers(lease, "k"),
                                          json={"n": 1})
    assert len(gw.hook.deliveries) == 1  # nothing sent this time
    state, attempts = await gw.pool.fetchrow("SELECT state, attempts FROM fencegate_effects "
                                             "WHERE idempotency_key = 'k'")
    assert (state, attempts) == ("unknown", 2)  # the ledger did not free it
    # the answer must say what a free that came to unknown says elsewhere
    assert (status, body.get("code"), headers.get("Fencegate-Problem")) == \
        (502, "provider_outcome_unknown", "provider_outcome_unknown"), (
        f"answered 429 configured_rate (docs: the key is free again) though the effect "
        f"reads {state}: {status} {body}")
