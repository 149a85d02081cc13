"""A resend inside the provider's window that comes while the provider is still
working on the first attempt.

A provider that dedupes on ``Idempotency-Key`` the way the IETF draft says
(draft-ietf-httpapi-idempotency-key-header, "Error Scenarios": a request
retried while the original is still being processed gets 409 Conflict; the
same answer as Stripe's ``idempotency_key_in_use``) answers such a resend 409.
That 409 says nothing of the first attempt, so it is never recorded as the
effect's answer, and no newer fence is granted while the fence-F request may
still be acted on.

Real gateway, real PostgreSQL, the provider on loopback (aiohttp).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from tests.integration.conftest import Gw
from tests.support.waiting import until

MakeGw = Callable[..., Awaitable[Gw]]
#: the first request takes this long (the gateway's timeout is 1 s)
WORK_SECONDS = 4.0


class IetfIdempotentApi:
    """``POST /api/orders`` creates an order, after ``WORK_SECONDS``. Keys
    are remembered: the same key again gets the first answer once it is
    there, 409 while the first request is still being processed."""

    def __init__(self) -> None:
        self.acted: list[tuple[str, str | None]] = []  # (key, Fence-Token)
        self.answers: dict[str, dict[str, Any] | None] = {}
        self.statuses: list[int] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def create(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        key = request.headers["Idempotency-Key"]
        if key in self.answers:
            answer = self.answers[key]
            if answer is None:
                self.statuses.append(409)
                return web.json_response({"error": "request_in_progress", "detail": "a "
                                          "request with this key is still being processed"},
                                         status=409)
            self.statuses.append(201)
            return web.json_response(answer, status=201)
        self.answers[key] = None
        await asyncio.sleep(WORK_SECONDS)
        self.acted.append((key, request.headers.get("Fence-Token")))
        answer = {"order": len(self.acted)}
        self.answers[key] = answer
        self.statuses.append(201)
        return web.json_response(answer, status=201)

    async def start(self) -> IetfIdempotentApi:
        app = web.Application()
        app.router.add_post("/api/orders", self.create)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def api() -> AsyncIterator[IetfIdempotentApi]:
    server = await IetfIdempotentApi().start()
    yield server
    await server.close()


async def _gateway(make_gw: MakeGw, api: IetfIdempotentApi) -> Gw:
    # the test config's crm: Idempotency-Key, a day's window, timeout 1 s
    return await make_gw(providers={"crm": {"base_url": f"http://127.0.0.1:{api.port}/api"}})


async def test_a_resend_answered_in_progress_is_not_the_effects_answer(
        make_gw: MakeGw, api: IetfIdempotentApi) -> None:
    gw = await _gateway(make_gw, api)
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.post("/v1/http/crm/orders", gw.headers(lease, "order-1"),
                                    json={"sku": "A"})
    # the first request has been acted on (its answer is stored): every
    # request that reached the provider has been answered by now
    await until(lambda: bool(api.answers) and None not in api.answers.values(),
                "the first request acted on")
    assert len(api.acted) == 1  # it dedupes: one order
    # the provider acted once: the effect happened. A 409 "still in progress"
    # is not its outcome, and must not be recorded and replayed as a failure
    assert status != 409, (
        f"the provider's 409 to a resend sent while the first attempt was still in "
        f"progress was answered as the effect's outcome: {body}")
    status_effect, _, effect = await gw.request("GET", "/v1/effects/order-1",
                                                gw.headers(key="order-1"))
    assert status_effect == 200
    assert effect["state"] != "failed", effect
    again, headers, replay = await gw.post("/v1/http/crm/orders", gw.headers(lease, "order-1"),
                                           json={"sku": "A"})
    assert again != 409, (again, headers, replay)


async def test_no_newer_fence_while_the_first_attempt_is_still_being_acted_on(
        make_gw: MakeGw, api: IetfIdempotentApi) -> None:
    """Without the resend, the attempt that timed out is unknown and holds the
    drain barrier until its deadline (more than 6 s here): the provider has
    acted by then. The resend's 409, recorded as a definite end, releases the
    barrier at once: the lease's holder gets a newer fence while the provider
    is still working on the fence-F request, which it then carries out."""
    gw = await _gateway(make_gw, api)
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    await gw.post("/v1/http/crm/orders", gw.headers(lease, "order-2"), json={"sku": "B"})
    # the record of the answer has landed (show_effect waits for it)
    await gw.request("GET", "/v1/effects/order-2", gw.headers(key="order-2"))
    newer = await gw.leases.claim("run:1", ttl=30)
    still_working = not api.acted
    await until(lambda: bool(api.answers) and None not in api.answers.values(),
                "the first request acted on")
    assert api.acted == [(api.acted[0][0], str(lease.fence))]  # fence F's request, acted on
    assert not (newer is not None and still_working), (
        f"fence {newer.fence if newer else None} was granted while the provider was "
        f"still acting on fence {lease.fence}'s request")
