"""A claim that committed but whose answer was lost does not leave the
resource to an owner nobody knows for the whole ttl."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from tests.integration.conftest import Gw
from tests.support.faultproxy import FaultProxy
from tests.support.waiting import until


@pytest.fixture
async def proxy(dsn: str, request: pytest.FixtureRequest) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy(dsn, delay_seconds=getattr(request, "param", 0.6)).start()
    yield p
    await p.close()


@pytest.mark.parametrize("proxy", [0.6, 1.5], indirect=True,
                         ids=["claim-lands-with-the-answer", "claim-lands-after-the-answer"])
async def test_a_claim_answered_503_does_not_hold_the_resource_for_its_ttl(
    make_gw: Callable[..., Awaitable[Gw]], proxy: FaultProxy, pool: asyncpg.Pool,
) -> None:
    """POST /v1/leases/claim without an owner: the gateway makes one up (one
    owner per lease, new in this commit). When the database is slow, the claim
    commits but the gateway has stopped waiting (database_timeout_seconds) and
    answers 503 "unavailable". The caller never learns the owner or the fence,
    so it can neither renew nor release; a retry gets another made-up owner and
    409 lease_held, for the whole ttl (up to 7 days). The same holds for
    LeaseClient.claim, which now also makes a new owner per call: a retry
    after a lost answer cannot re-claim as the same owner any more.

    The pool's command timeout (database_timeout_seconds) also bounds the
    cancel request: when it goes unanswered, asyncpg drops the connection and
    the 503 goes out while the claim is still on its way (held 1.5 s by the
    proxy here; a slow link or a pooler does the same). The first attempt to
    abandon it then finds nothing to end, and the claim lands after it."""
    gw = await make_gw(proxy.dsn(), database_timeout_seconds=0.3)
    auth = {"Authorization": gw.headers()["Authorization"]}
    for i in range(3):  # the claim statement is prepared on the pool's connection
        assert (await gw.post("/v1/leases/claim", auth, json={
            "resource": f"run:warm-{i}", "ttl_seconds": 60}))[0] == 200
    proxy.set_mode("delay")
    status, _, body = await gw.post("/v1/leases/claim", auth,
                                    json={"resource": "run:orphan", "ttl_seconds": 3600})
    assert (status, body["code"]) == (503, "unavailable")
    assert "may still have been carried out" in body["detail"]  # not "nothing was sent"
    proxy.set_mode("pass")
    # the abandon has its answer: the made-up owner is recorded, and the
    # orphan's lease ended with it, or refused whenever its claim lands
    await until(lambda: pool.fetchval("SELECT count(*) > 0 FROM fencegate_abandoned_owners"),
                "the gateway's abandon of the claim it gave up")
    # a chance for the delayed claim to land first (nothing waits on it: a
    # busy machine only makes the retry come before it)
    await asyncio.sleep(proxy.delay_seconds + 0.4)
    row = await pool.fetchrow("SELECT owner, expires_at > clock_timestamp() AS live "
                              "FROM fencegate_leases WHERE resource = 'run:orphan'")
    answers: list[tuple[int, dict[str, object]]] = []

    async def retried() -> bool:  # the caller retries, as 503 invites it to
        status, _, body = await gw.post("/v1/leases/claim", auth,
                                        json={"resource": "run:orphan", "ttl_seconds": 3600})
        answers.append((status, body))
        return status != 503

    await until(retried, "an answer to the retry other than 503", every=0.2)
    status, body = answers[-1]
    assert status == 200, (
        f"the retry got {status} {body.get('code')}: run:orphan is held for an hour by "
        f"{row['owner'] if row else None!r}, an owner the caller was never told")
