"""Leases over HTTP, the service routes, and the Python gateway client."""

from __future__ import annotations

import asyncio

import pytest

from gateway.api.routes import ROUTES
from gateway.client import FenceRejected, FenceToken, GatewayClient
from leases import LeaseClient, LeaseLost
from tests.integration.conftest import API_KEY, Gw
from tests.support.waiting import until


async def test_leases_over_http(gw: Gw) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    before = await gw.metric("fencegate_lease_claims_total", result="won")
    status, _, a = await gw.post("/v1/leases/claim", auth,
                                 json={"resource": "run:h", "owner": "w1", "ttl_seconds": 30})
    assert status == 200 and a["owner"] == "w1" and a["fence"] > 0 and a["ttl_seconds"] == 30
    assert await gw.metric("fencegate_lease_claims_total", result="won") == before + 1
    status, _, body = await gw.post("/v1/leases/claim", auth,
                                    json={"resource": "run:h", "ttl_seconds": 30})
    assert (status, body["code"]) == (409, "lease_held")
    status, _, r = await gw.post("/v1/leases/renew", auth, json={
        "resource": "run:h", "owner": "w1", "fence": a["fence"], "ttl_seconds": 60})
    assert status == 200 and r["expires_at"] > a["expires_at"]
    status, _, body = await gw.post("/v1/leases/renew", auth, json={
        "resource": "run:h", "owner": "w2", "fence": a["fence"], "ttl_seconds": 60})
    assert (status, body["code"]) == (409, "lease_lost")
    status, _, shown = await gw.request("GET", "/v1/leases/run:h", auth)
    assert status == 200 and shown["live"] is True and shown["fence"] == a["fence"]
    status, _, body = await gw.post("/v1/leases/release", auth, json={
        "resource": "run:h", "owner": "w1", "fence": a["fence"]})
    assert body == {"released": True}
    status, _, body = await gw.post("/v1/leases/release", auth, json={
        "resource": "run:h", "owner": "w1", "fence": a["fence"]})
    assert body == {"released": False}
    status, _, b = await gw.post("/v1/leases/claim", auth,
                                 json={"resource": "run:h", "ttl_seconds": 30})
    assert status == 200 and b["fence"] > a["fence"] and b["owner"]


async def test_lease_routes_check_input_and_scope(gw: Gw) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    for body in ({}, {"resource": "run:x"}, {"resource": "bad res", "ttl_seconds": 1},
                 {"resource": "run:x", "ttl_seconds": "10"}, {"resource": "run:x",
                                                              "ttl_seconds": -1}):
        status, _, doc = await gw.post("/v1/leases/claim", auth, json=body)
        assert (status, doc["code"]) == (400, "bad_request"), body
    status, _, doc = await gw.post("/v1/leases/claim", auth,
                                   json={"resource": "other:1", "ttl_seconds": 5})
    assert (status, doc["code"]) == (403, "forbidden_resource")
    status, _, doc = await gw.post("/v1/leases/claim", {}, json={})
    assert (status, doc["code"]) == (401, "unauthenticated")


async def test_service_routes(gw: Gw) -> None:
    assert (await gw.request("GET", "/healthz", {}))[0] == 200
    status, _, body = await gw.request("GET", "/readyz", {})
    assert status == 200 and body["status"] == "ready"
    status, _headers, body = await gw.request("GET", "/metrics", {})
    assert status == 200 and b"fencegate_effects_total" in body
    status, _, doc = await gw.request("GET", "/nope", {})
    assert (status, doc["code"]) == (404, "not_found")


async def test_openapi_describes_every_routed_path(gw: Gw) -> None:
    status, _, doc = await gw.request("GET", "/openapi.json", {})
    assert status == 200 and doc["openapi"].startswith("3.1")
    for route in ROUTES:
        assert route.method.lower() in doc["paths"][route.openapi_path]
    email = doc["paths"]["/v1/email"]["post"]
    names = {p["name"] for p in email["parameters"]}
    assert {"Fence-Resource", "Fence-Token", "Idempotency-Key"} <= names
    assert "412" in email["responses"]


async def test_gateway_client_sends_under_a_lease_and_raises_typed_problems(gw: Gw) -> None:
    a = LeaseClient(pool=gw.pool, owner="a")
    b = LeaseClient(pool=gw.pool, owner="b")
    async with GatewayClient(gw.url, API_KEY) as client:
        # a ttl no machine outlasts while the calls below are made; the
        # lease then ends as if it had lapsed
        lease = await a.claim("run:c", ttl=30)
        assert lease is not None
        first = await client.send_email(lease, "c-1", sender="a@example.com",
                                        to=["b@example.com"], subject="s", text="t")
        assert first.status == 200 and not first.replayed
        again = await client.send_email(lease, "c-1", sender="a@example.com",
                                        to=["b@example.com"], subject="s", text="t")
        assert again.replayed and again.json() == first.json()
        result = await client.request(lease, "c-2", "crm", "POST", "/notes", json={"n": 1})
        assert result.status == 200 and result.json() == {"ok": True}
        await gw.pool.execute("UPDATE fencegate_leases SET expires_at = clock_timestamp() "
                              "WHERE resource = 'run:c'")
        newer = await b.claim("run:c", ttl=30)
        assert newer is not None
        # a worker that kept its fence but not our lease client: only the gateway stops it
        zombie = FenceToken(lease.resource, lease.fence)
        with pytest.raises(FenceRejected) as rejected:
            await client.request(zombie, "c-3", "crm", "POST", "/notes", json={})
        assert rejected.value.code == "stale_fence"
        assert rejected.value.current_fence == newer.fence
        assert len(gw.hook.deliveries) == 1


async def test_gateway_client_attempts_nothing_once_the_lease_is_lost(gw: Gw) -> None:
    a = LeaseClient(pool=gw.pool, owner="a")
    lease = await a.claim("run:d", ttl=30)
    assert lease is not None
    async with GatewayClient(gw.url, API_KEY) as client:
        lease._lose("taken", "test")  # as the keeper does when a renewal is refused
        with pytest.raises(LeaseLost):
            await client.request(lease, "d-1", "crm", "POST", "/x", json={})
    assert gw.hook.deliveries == []


async def test_a_worker_sends_effects_under_its_job_s_fence(gw: Gw) -> None:
    from leases import Queue, Worker
    from leases.queue import Job

    q = Queue(LeaseClient(pool=gw.pool, owner="worker-q"), "outreach")
    await q.enqueue({"to": "lead@example.com"}, dedupe_key="lead-1")
    async with GatewayClient(gw.url, API_KEY) as client:

        async def handler(job: Job) -> str:
            sent = await client.send_email(job.lease, f"outreach-{job.id}",
                                           sender="agent@example.com",
                                           to=[job.payload["to"]], subject="Hi", text="...")
            return str(sent.json()["message_id"])

        worker = Worker(q, handler, concurrency=2, poll_min=0.01, poll_max=0.02)
        task = asyncio.create_task(worker.run())

        async def completed() -> bool:
            return bool((await q.stats()).get("completed"))

        try:
            await until(completed, "the job completed")
        finally:
            worker.stop()
            await task
    [row] = await q.list()
    [mail] = gw.smtp.deliveries
    assert row["state"] == "completed" and row["result_ref"] == mail.header("Message-ID")
    assert mail.header("Fence-Resource") == f"job:outreach:{row['id']}"
    assert mail.header("Fence-Token") == str(row["fence"])


async def test_a_newer_additive_schema_keeps_an_older_gateway_ready(gw: Gw) -> None:
    """During a rolling upgrade the new version migrates first: the old
    gateways answered 503 on /readyz at once and were all pulled from
    service. An additive migration leaves them ready; a breaking one not."""
    await gw.pool.execute("INSERT INTO fencegate_migrations (version, name) VALUES (900, 'next')")
    status, _, body = await gw.request("GET", "/readyz", {})
    assert status == 200 and body["schema_version"] == 900
    await gw.pool.execute("UPDATE fencegate_migrations SET breaking = true WHERE version = 900")
    status, _, body = await gw.request("GET", "/readyz", {})
    assert (status, body["code"]) == (503, "unavailable")
    assert "upgrade fencegate" in body["detail"]


async def test_an_admission_arriving_after_its_attempt_was_abandoned_is_refused(
    gw: Gw,
) -> None:
    """The gateway gave an attempt up (its admission's answer never came) and
    freed it by nonce before the admission had even run; the statement,
    arriving later still, must not leave the key in flight for nobody."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    freed = await gw.pool.fetchval(
        "SELECT fencegate_finish_effect('agents', 'late', 77, 'run:1', 'free', NULL, NULL, "
        "NULL, NULL)")
    assert freed == "gone"  # nothing to free yet: remembered as abandoned
    verdict = await gw.pool.fetchval(
        "SELECT verdict FROM fencegate_admit_effect('agents', 'late', '\\x00'::bytea, 'run:1', "
        "$1, 'mail', 77, 10.0, 0, 5.0)", lease.fence)
    assert verdict == "abandoned"
    assert await gw.pool.fetchval("SELECT count(*) FROM fencegate_effects") == 0
    assert await gw.pool.fetchval("SELECT inflight FROM fencegate_leases") == 0
    # the key itself is not blocked: a new attempt goes through
    status, _, _ = await gw.email(lease, "late")
    assert status == 200
