"""The outcome is recorded behind the answer (issue 11): until the record
lands, a repeat of the key is never a second send, and a gateway that dies
before it lands leaves the effect unknown, not free.

Gateway A reaches the database through a fault proxy, which black-holes the
moment the provider receives the effect: A answers its caller, and its
record never lands (A is as good as dead). Gateway B, on the same database,
gets the repeats."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.integration.conftest import Gw
from tests.support.faultproxy import FaultProxy


@pytest.fixture
async def proxy(dsn: str) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy(dsn).start()
    yield p
    p.set_mode("drop")  # A's shutdown gives up on its record at once
    await p.close()


async def test_a_repeat_before_the_record_lands_is_in_progress_then_unknown_never_resent(
    make_gw: Callable[..., Awaitable[Gw]], proxy: FaultProxy,
) -> None:
    a = await make_gw(proxy.dsn(), database_timeout_seconds=1)
    b = await make_gw()
    lease = await b.leases.claim("run:behind", ttl=60)
    assert lease is not None
    a.hook.on_request = lambda _: proxy.set_mode("blackhole")

    status, _, body = await a.post("/v1/http/hook/x", a.headers(lease, "once"), json={"n": 1})
    assert status == 200, body  # the caller has the provider's answer
    assert len(a.hook.deliveries) == 1
    assert await b.effect_state("once") == "in_flight"

    # another process, while the record has not landed: in progress, nothing sent
    status, headers, body = await b.post("/v1/http/hook/x", b.headers(lease, "once"),
                                         json={"n": 1})
    assert (status, body["code"]) == (409, "effect_in_progress")
    assert int(headers["Retry-After"]) >= 1
    assert len(b.hook.deliveries) == 1

    # A never records it (it died): past the attempt's deadline the effect
    # reads unknown, and is still not sent again
    await b.past_deadline("once")
    status, _, body = await b.post("/v1/http/hook/x", b.headers(lease, "once"), json={"n": 1})
    assert (status, body["code"]) == (409, "effect_outcome_unknown")
    assert len(b.hook.deliveries) == 1
    assert await b.effect_state("once") == "unknown"
