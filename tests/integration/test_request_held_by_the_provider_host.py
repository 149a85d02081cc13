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

from tests.integration.conftest import Gw
from tests.integration.test_drain_on_the_wire import FAST
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


@pytest.mark.xfail(strict=True, reason="resolve not_sent frees a key whose whole request sits "
                   "in the provider host's receive queue; the gateway does not know whether the "
                   "provider's host acknowledged the whole request (see the report)")
async def test_a_key_resolved_not_sent_acts_once_when_its_request_was_held(
    make_gw: Callable[..., Awaitable[Gw]], held: HeldProvider,
) -> None:
    """The first attempt's small request reaches the provider's host whole,
    unread; the attempt times out (504) and its connection is reset. The
    operator resolves the key ``not_sent`` as soon as the gateway lets them,
    the repeat goes out on a fresh connection and the provider acts. When the
    provider reads the held connection, the first request must not act too:
    one key, one provider action."""
    gw = await make_gw(providers=_held_hook(held), **FAST)
    lease = await gw.leases.claim("run:A", ttl=60)
    assert lease is not None
    status, _, body = await gw.post("/v1/http/heldhook/x", gw.headers(lease, "held-1"),
                                    data=b"y" * 1000)
    assert status == 504 and body["code"] == "provider_timeout", (status, body)
    auth = {"Authorization": gw.headers()["Authorization"]}
    while True:  # refused (409) while an attempt may be under way
        status, _, body = await gw.post("/v1/effects/held-1/resolve", auth,
                                        json={"outcome": "not_sent"})
        if status == 200:
            break
        assert (status, body["code"]) == (409, "effect_in_progress"), body
        await asyncio.sleep(0.1)
    status, _, body = await gw.post("/v1/http/heldhook/x", gw.headers(lease, "held-1"),
                                    data=b"y" * 1000)
    assert status == 200, body  # the repeat, on a fresh connection
    assert len(held.acted) == 1
    held.release()  # the provider gets to the connection it held
    first = held.conns[0]
    await first.ended.wait()
    assert len(held.acted) == 1, "the key acted twice: the held request was acted on late"
