"""Review 6: a configured-rate refusal whose free came to ``unknown`` is
still answered 429 ``rate_limited`` / ``configured_rate`` (gateway/effects.py
``run``, the ``wait > 0`` branch; commit 69cd095).

69cd095 made a free that comes to ``unknown`` (the key was admitted again
inside a deduping provider's window after an attempt whose outcome is
unknown: ``attempts`` 2) answer 502 ``provider_outcome_unknown``, "never
'the key is free again'" (docs/gateway.md). Only the provider's not-acted
outcomes go through ``_not_freed``: the configured-rate refusal appends a
sentence to its detail but keeps 429 ``rate_limited`` with ``reason:
configured_rate``, which docs/gateway.md ("Answers") reads as "nothing was
sent ... the key is free again", and ``GatewayClient`` raises
``RateLimited`` (retry after ``Retry-After``). The effect is ``unknown``: the
first attempt may have acted. A caller that takes the code at its word (a
rate limit; nothing happened) may do it again under a new key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.integration.conftest import Gw


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
