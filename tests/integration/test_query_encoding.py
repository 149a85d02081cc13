"""The forwarded query string reaches the provider as the caller sent it,
never percent-encoded a second time."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from tests.integration.conftest import Gw


async def test_the_query_reaches_the_provider_as_the_caller_sent_it(gw: Gw) -> None:
    """HttpProvider.url() hands the raw (already encoded) query string to
    yarl's ``with_query(str)``, which takes a decoded string and encodes it:
    every ``%`` becomes ``%25``. ``?email=a%40b.example&q=x%20y`` reaches the
    provider as ``?email=a%2540b.example&q=x%2520y``: the provider acts on a
    different request than the one the caller made (and fingerprinted)."""
    lease = await gw.leases.claim("lead:q", ttl=30)
    assert lease is not None
    status, _, _ = await gw.request(
        "GET", "/v1/http/crm/contacts?email=a%40b.example&q=x%20y", gw.headers(lease, "q1"))
    assert status == 200
    [d] = gw.hook.deliveries
    received = parse_qs(urlsplit(d.path).query)
    assert received.get("q") == ["x y"], f"the provider got {d.path!r}"
