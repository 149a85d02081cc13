"""The receiver side (gateway/receiver/) against the gateway's own signed
requests: a real gateway sends HTTP effects to an aiohttp receiver behind
``fence_middleware`` (fences in the receiver's PostgreSQL), and a FastAPI
receiver behind ``FencedDelivery``. The gateway refuses a stale fence
itself, so the receiver's refusals are driven by sending it what a zombie
or an attacker would: a captured older request, a forged fence."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.receiver import DELIVERY, PostgresFences, Verifier, fence_middleware
from leases import Lease
from tests.integration.conftest import PROVIDER_TIMEOUT, SIGNING_SECRET, Gw
from tests.support.waiting import until


@dataclass
class Receiver:
    """An aiohttp service behind the middleware; what its handler saw, and
    every request that reached it, as sent (to send again)."""

    url: str
    fences: PostgresFences
    acted: list[tuple[str, int, bytes]] = field(default_factory=list)
    seen: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
async def receiver(pool: asyncpg.Pool) -> AsyncIterator[Receiver]:
    fences = PostgresFences(pool)
    await fences.create_table()
    verifier = Verifier(SIGNING_SECRET, fences)
    state: list[Receiver] = []

    @web.middleware
    async def capture(request: web.Request, handler: Callable[[web.Request],
                                                               Awaitable[web.StreamResponse]],
                      ) -> web.StreamResponse:
        state[0].seen.append((dict(request.headers), await request.read()))
        return await handler(request)

    async def hook(request: web.Request) -> web.Response:
        delivery = request[DELIVERY]
        state[0].acted.append((delivery.resource, delivery.fence, delivery.body))
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[capture, fence_middleware(verifier)])
    app.router.add_post("/receiver/{tail:.*}", hook)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    state.append(Receiver(str(server.make_url("/receiver")), fences))
    yield state[0]
    await server.close()


@pytest.fixture
async def gw(make_gw: Callable[..., Awaitable[Gw]], receiver: Receiver) -> Gw:
    return await make_gw(providers={"receiver": {
        "kind": "http", "base_url": receiver.url, "timeout_seconds": PROVIDER_TIMEOUT,
        "rate_limit_per_second": 1000, "signing_secret_env": "FENCEGATE_TEST_SIGNING_SECRET"}})


async def _send_direct(url: str, headers: dict[str, str], body: bytes,
                       ) -> tuple[int, dict[str, object]]:
    kept = {k: v for k, v in headers.items()
            if k.lower() not in ("host", "content-length", "transfer-encoding")}
    async with aiohttp.ClientSession() as http, http.post(url, headers=kept, data=body) as r:
        return r.status, await r.json(content_type=None)


async def _two_holders(gw: Gw) -> tuple[int, int]:
    """Fence F sends an effect, its lease lapses, F+1 sends one: both reach
    the receiver through the gateway."""
    old = await gw.leases.claim("lead:1", ttl=30)
    assert old is not None
    status, _, _ = await gw.post("/v1/http/receiver/notes", gw.headers(old, "a"),
                                 json={"note": "old"})
    assert status == 200
    assert await old.release()
    claimed: list[Lease] = []

    async def claim() -> bool:  # once the old effect's drain barrier has passed
        lease = await gw.leases.claim("lead:1", ttl=30)
        claimed.extend([lease] if lease is not None else [])
        return lease is not None

    await until(claim, "the next holder's claim")
    new = claimed[0]
    status, _, _ = await gw.post("/v1/http/receiver/notes", gw.headers(new, "b"),
                                 json={"note": "new"})
    assert status == 200
    return old.fence, new.fence


async def test_the_gateways_requests_pass_and_the_highest_fence_is_kept(
    gw: Gw, receiver: Receiver,
) -> None:
    old, new = await _two_holders(gw)
    assert [(r, f) for r, f, _ in receiver.acted] == [("lead:1", old), ("lead:1", new)]
    assert await receiver.fences.highest("lead:1") == new


async def test_a_late_request_under_an_older_fence_is_refused(
    gw: Gw, receiver: Receiver,
) -> None:
    """The zombie's request, held somewhere and delivered after F+1's (the
    receive-queue case of docs/gateway.md): the receiver refuses it, and its
    handler never runs."""
    _old, new = await _two_holders(gw)
    headers, body = receiver.seen[0]
    status, problem = await _send_direct(receiver.url + "/notes", headers, body)
    assert (status, problem["code"], problem["current_fence"]) == (412, "stale_fence", new)
    assert len(receiver.acted) == 2
    # the same holder sending again is its own business (equal passes)
    headers, body = receiver.seen[1]
    assert (await _send_direct(receiver.url + "/notes", headers, body))[0] == 200


async def test_a_forged_fence_token_is_refused_and_stored_nowhere(
    gw: Gw, receiver: Receiver,
) -> None:
    """A captured signed request sent again with a huge Fence-Token would
    refuse every real fence after it, if the receiver believed it."""
    _old, new = await _two_holders(gw)
    headers, body = receiver.seen[1]
    for name, value in (("Fence-Token", str(2**62)), ("Fence-Resource", "lead:2")):
        forged = {**headers, name: value}
        status, problem = await _send_direct(receiver.url + "/notes", forged, body)
        assert (status, problem["code"]) == (401, "bad_fence_signature"), name
    unsigned = {k: v for k, v in headers.items() if k.lower() != "fence-signature"}
    status, problem = await _send_direct(receiver.url + "/notes", unsigned, body)
    assert (status, problem["code"]) == (401, "bad_fence_signature")
    status, problem = await _send_direct(receiver.url + "/notes", headers, body + b" ")
    assert (status, problem["code"]) == (401, "bad_signature")
    assert await receiver.fences.highest("lead:1") == new
    assert await receiver.fences.highest("lead:2") is None
    assert len(receiver.acted) == 2


async def test_the_receivers_refusal_comes_back_through_the_gateway(
    gw: Gw, receiver: Receiver, pool: asyncpg.Pool,
) -> None:
    """A receiver that has seen a newer fence (from another gateway, or the
    fence store restored ahead) refuses the gateway's current one: the
    caller gets the receiver's 412 as the provider's answer, recorded
    failed, and its handler never ran."""
    lease = await gw.leases.claim("lead:3", ttl=30)
    assert lease is not None
    await receiver.fences.advance("lead:3", lease.fence + 1)
    status, headers, body = await gw.post("/v1/http/receiver/x", gw.headers(lease, "c"),
                                          json={})
    assert (status, body["code"]) == (412, "stale_fence")
    assert "Fencegate-Problem" not in headers  # the provider's answer, not the gateway's
    assert await gw.effect_state_after("c") == "failed"
    assert receiver.acted == []


async def test_a_fastapi_dependency_checks_the_gateways_requests(
    gw: Gw, receiver: Receiver,
) -> None:
    """The same captured requests, at a FastAPI receiver (Starlette's
    TestClient) with ``FencedDelivery``."""
    pytest.importorskip("fastapi")
    from fastapi import Depends, FastAPI
    from fastapi.testclient import TestClient

    from gateway.receiver import Delivery, MemoryFences
    from gateway.receiver.dependency import FencedDelivery

    await _two_holders(gw)
    fenced = FencedDelivery(Verifier(SIGNING_SECRET, MemoryFences()))
    app = FastAPI()
    acted: list[int] = []

    @app.post("/receiver/notes")
    async def notes(delivery: Delivery = Depends(fenced)) -> dict[str, int]:  # noqa: B008
        acted.append(delivery.fence)
        return {"fence": delivery.fence}

    def send(headers: dict[str, str], body: bytes) -> tuple[int, object]:
        kept = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        with TestClient(app) as client:
            answer = client.post("/receiver/notes", headers=kept, content=body)
        return answer.status_code, answer.json()

    (old_h, old_b), (new_h, new_b) = receiver.seen
    old, new = int(old_h["Fence-Token"]), int(new_h["Fence-Token"])
    assert await asyncio.to_thread(send, old_h, old_b) == (200, {"fence": old})
    assert await asyncio.to_thread(send, new_h, new_b) == (200, {"fence": new})
    status, answer = await asyncio.to_thread(send, old_h, old_b)
    assert status == 412 and str(answer["detail"]).startswith("stale_fence: ")  # type: ignore[index]
    status, answer = await asyncio.to_thread(send, {**new_h, "Fence-Token": "99"}, new_b)
    assert status == 401 and str(answer["detail"]).startswith("bad_fence_signature: ")  # type: ignore[index]
    assert acted == [old, new]


async def test_a_failing_fence_store_answers_503_without_a_traceback(
    gw: Gw, receiver: Receiver, pool: asyncpg.Pool,
) -> None:
    """The receiver could not check: nothing was done, and the gateway frees
    the key (503 is a provider's "not acted")."""
    await pool.execute(f"DROP TABLE {receiver.fences.table}")
    lease = await gw.leases.claim("lead:4", ttl=30)
    assert lease is not None
    await gw.post("/v1/http/receiver/x", gw.headers(lease, "d"), json={})
    headers, body = receiver.seen[0]
    status, problem = await _send_direct(receiver.url + "/x", headers, body)
    assert (status, problem["code"]) == (503, "unavailable")
    assert "Traceback" not in str(problem) and "asyncpg" not in str(problem)
    assert receiver.acted == []


async def test_in_the_receivers_transaction_a_newer_fence_waits_for_the_older_commit(
    pool: asyncpg.Pool,
) -> None:
    """``PostgresFences(conn)`` in the handler's transaction: the fence's row
    stays locked until it ends, so F+1's check (and its writes) come after
    F's writes commit; a transaction rolled back records no fence."""
    await PostgresFences(pool).create_table()
    async with pool.acquire() as older, pool.acquire() as newer:
        async with older.transaction():
            assert await PostgresFences(older).advance("r", 9) == 9
        tx = older.transaction()
        await tx.start()
        assert await PostgresFences(older).advance("r", 10) == 10
        waiting = asyncio.create_task(PostgresFences(newer).advance("r", 11))
        await until(lambda: _waits_on_a_lock(pool), "the newer check waits on the row")
        assert not waiting.done()
        await tx.rollback()  # the older handler failed: its fence is not kept
        assert await waiting == 11
    assert await PostgresFences(pool).highest("r") == 11
    assert await PostgresFences(pool).advance("r", 10) == 11


async def _waits_on_a_lock(pool: asyncpg.Pool) -> bool:
    return bool(await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"))


async def test_concurrent_checks_keep_the_highest_fence(pool: asyncpg.Pool) -> None:
    """Many checks of one resource at once, fences shuffled: every refused
    fence is below one that passed, and the highest is stored."""
    fences = PostgresFences(pool)
    await fences.create_table()
    sent = list(range(1, 201))
    random.Random(7).shuffle(sent)
    answers = await asyncio.gather(*(fences.advance("race", f) for f in sent))
    passed = [f for f, highest in zip(sent, answers, strict=True) if highest == f]
    assert max(sent) in passed
    for f, highest in zip(sent, answers, strict=True):
        assert highest >= f and (highest == f or highest in passed)
    assert await fences.highest("race") == max(sent)
