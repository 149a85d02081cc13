"""A 502 or 500 from a provider that dedupes nothing does not free the key:
the request may have been acted on."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Gw


@pytest.mark.parametrize("provider_status", [500, 502])
async def test_an_ambiguous_5xx_from_a_provider_without_dedupe_does_not_free_the_key(
    gw: Gw, provider_status: int,
) -> None:
    """HttpProvider treats 500, 502 and 503 as "the provider certainly did
    not act; the key is free again", yet treats a 504 as unknown because "a
    proxy in front of the provider answers after the provider may have acted".
    A 502 is exactly that too (nginx/ELB: "upstream prematurely closed the
    connection" after the backend took the request), and a 500 is commonly
    answered after part of the work committed. For a provider that dedupes
    nothing (``idempotency_header = ""``: plain webhooks), freeing the key
    turns the caller's retry of the same key into a second action. Here the
    sink records the request (it acted) and answers the status."""
    lease = await gw.leases.claim("run:5xx", ttl=30)
    assert lease is not None
    gw.hook.status = provider_status
    status, _, body = await gw.request("POST", "/v1/http/hook/charge", gw.headers(lease, "c1"),
                                       json={"amount": 100})
    gw.hook.status = 200
    again, _, _ = await gw.request("POST", "/v1/http/hook/charge",
                                       gw.headers(lease, "c1"), json={"amount": 100})
    assert len(gw.hook.deliveries) == 1, (
        f"one key, two provider actions: first answered {status} {body.get('code')}, "
        f"the retry {again} and was sent again")
