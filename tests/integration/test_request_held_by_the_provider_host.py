"""A request that reached the provider's host whole is not "not sent".

An RST does not erase what the provider's kernel already accepted. A request
the gateway wrote whole before its deadline, to a provider that had not read
it yet (stalled, slow, busy), is complete in that host's receive queue when
the gateway gives up and resets the connection: the provider reads it and
acts whenever it gets to it, with no bound in time. So once an attempt's
whole request was acknowledged by the provider's host, nothing the gateway
does afterwards (the reset, the barrier's end, an operator's resolve) makes
it unsent: one key may lead to two provider actions only if the gateway or
an operator treats such an attempt as not sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.ledger import HELD_REQUEST_SECONDS
from tests.integration.conftest import Gw
from tests.support.drain import FAST
from tests.support.heldprovider import HeldProvider


@pytest.fixture
async def held() -> AsyncIterator[HeldProvider]:
    provider = await HeldProvider(held=1).start()
    yield provider
    await provider.close()


def _held_hook(provider: HeldProvider) -> dict[str, dict[str, object]]:
    return {"heldhook": {"kind": "http", "base_url": f"http://127.0.0.1:{provider.port}/hook",
                         "timeout_seconds": 1, "rate_limit_per_second": 1000,
                         "idempotency_header": ""}}


async def test_a_key_whose_request_may_be_held_is_not_resolved_not_sent_early(
    make_gw: Callable[..., Awaitable[Gw]], held: HeldProvider,
) -> None:
    """The first attempt's small request reaches the provider's host whole,
    unread; the attempt times out (504) and its connection is reset. Once the
    attempt is over, "sent" may be resolved, but "not sent" is refused for the
    held-request window (409 effect_in_progress, a Retry-After that long): the
    provider may still read the request and act. When it does, it acts once,
    and a repeat of the key sends nothing: one key, one provider action."""
    gw = await make_gw(providers=_held_hook(held), **FAST)
    lease = await gw.leases.claim("run:A", ttl=60)
    assert lease is not None
    status, _, body = await gw.post("/v1/http/heldhook/x", gw.headers(lease, "held-1"),
                                    data=b"y" * 1000)
    assert status == 504 and body["code"] == "provider_timeout", (status, body)
    auth = {"Authorization": gw.headers()["Authorization"]}
    while True:  # until the attempt is over: then "sent" could be resolved
        status, _, shown = await gw.request("GET", "/v1/effects/held-1", auth)
        assert status == 200, shown
        if shown["state"] == "unknown" and not shown["resolvable_in_seconds"]:
            break
        await asyncio.sleep(0.1)
    status, headers, body = await gw.post("/v1/effects/held-1/resolve", auth,
                                          json={"outcome": "not_sent"})
    assert (status, body["code"]) == (409, "effect_in_progress"), body
    assert "whole request" in body["detail"]
    assert float(headers["Retry-After"]) > HELD_REQUEST_SECONDS / 2
    held.release()  # the provider gets to the connection it held, and acts
    await held.conns[0].ended.wait()
    assert len(held.acted) == 1
    status, _, body = await gw.post("/v1/http/heldhook/x", gw.headers(lease, "held-1"),
                                    data=b"y" * 1000)
    assert (status, body["code"]) == (409, "effect_outcome_unknown"), body
    assert len(held.acted) == 1, "the key acted twice"


async def test_a_request_that_never_left_whole_is_resolved_not_sent_at_once(
    make_gw: Callable[..., Awaitable[Gw]], held: HeldProvider,
) -> None:
    """A request whose tail never reached the kernel (the provider stopped
    reading, asyncio still held the rest when the attempt was reset) cannot
    be whole at the provider: "not sent" is allowed as soon as the attempt is
    over, and the repeat acts once."""
    gw = await make_gw(providers=_held_hook(held), **FAST)
    lease = await gw.leases.claim("run:A", ttl=60)
    assert lease is not None
    status, _, body = await gw.post("/v1/http/heldhook/x", gw.headers(lease, "big-1"),
                                    data=b"y" * 900_000)  # far past what both kernels buffer
    assert status == 504 and body["code"] == "provider_timeout", (status, body)
    auth = {"Authorization": gw.headers()["Authorization"]}
    while True:  # refused only while the attempt may be under way
        status, _, body = await gw.post("/v1/effects/big-1/resolve", auth,
                                        json={"outcome": "not_sent"})
        if status == 200:
            break
        assert (status, body["code"]) == (409, "effect_in_progress"), body
        assert "whole request" not in body["detail"], body
        await asyncio.sleep(0.1)
    held.release()
    await held.conns[0].ended.wait()
    assert held.acted == []  # the held connection never carried a whole request
