"""A JSON body nested deeper than the parser recurses (RecursionError, which
is not a ValueError) is a 400 bad_request on every route that reads JSON,
with nothing reserved and no traceback logged."""

from __future__ import annotations

import logging

import pytest

from tests.integration.conftest import Gw

DEEP = b"[" * 30_000 + b"]" * 30_000  # within max_body_bytes (64 KiB)
DEEP_OBJECT = b'{"a":' * 10_000 + b"1" + b"}" * 10_000


@pytest.mark.parametrize("data", [DEEP, DEEP_OBJECT], ids=["array", "object"])
@pytest.mark.parametrize("path", ["/v1/leases/claim", "/v1/leases/renew", "/v1/email",
                                  "/v1/http/crm/contacts", "/v1/effects/k-deep/resolve"])
async def test_deeply_nested_json_is_a_bad_request(
        gw: Gw, caplog: pytest.LogCaptureFixture, path: str, data: bytes) -> None:
    lease = await gw.leases.claim("lead:1", ttl=30)
    assert lease is not None
    with caplog.at_level(logging.INFO):
        status, _, body = await gw.post(path, {**gw.headers(lease, "k-deep"),
                                               "Content-Type": "application/json"}, data=data)
    assert status == 400 and body["code"] == "bad_request", body
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert gw.hook.deliveries == [] and gw.smtp.deliveries == []
    assert await gw.effect_state("k-deep") is None
