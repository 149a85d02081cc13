"""An idempotency key belongs to the resource it was first admitted under:
the same key under another Fence-Resource is 422 idempotency_key_reused
(whose detail names neither the key nor the other resource); under the same
resource, a newer fence still gets the stored answer."""

from __future__ import annotations

from tests.integration.conftest import Gw


async def test_a_key_under_another_resource_is_reused_not_replayed(gw: Gw) -> None:
    x = await gw.leases.claim("run:x-secret", ttl=30)
    y = await gw.leases.claim("run:y", ttl=30)
    assert x is not None and y is not None
    status, _, _ = await gw.email(x, "k-shared-key")
    assert status == 200
    status, headers, body = await gw.email(y, "k-shared-key")
    assert status == 422 and body["code"] == "idempotency_key_reused", body
    assert "Idempotent-Replayed" not in headers
    assert "run:x-secret" not in str(body) and "k-shared-key" not in body["detail"]
    assert len(gw.smtp.deliveries) == 1


async def test_a_key_under_another_resource_is_refused_over_http(gw: Gw) -> None:
    x = await gw.leases.claim("lead:1", ttl=30)
    y = await gw.leases.claim("lead:2", ttl=30)
    assert x is not None and y is not None
    status, _, _ = await gw.request("POST", "/v1/http/hook/a", gw.headers(x, "h-k"),
                                    json={"n": 1})
    assert status == 200
    status, _, body = await gw.request("POST", "/v1/http/hook/a", gw.headers(y, "h-k"),
                                       json={"n": 1})
    assert status == 422 and body["code"] == "idempotency_key_reused", body
    assert len(gw.hook.deliveries) == 1


async def test_a_newer_fence_of_the_same_resource_gets_the_stored_answer(gw: Gw) -> None:
    first = await gw.leases.claim("run:x", ttl=30)
    assert first is not None
    status, _, sent = await gw.email(first, "k-same")
    assert status == 200
    assert await first.release()
    second = await gw.leases.claim("run:x", ttl=30)
    assert second is not None and second.fence > first.fence
    status, headers, body = await gw.email(second, "k-same")
    assert status == 200 and headers["Idempotent-Replayed"] == "true"
    assert body == sent
    assert len(gw.smtp.deliveries) == 1
