"""A JSON body nested deeper than the parser recurses (RecursionError, which
is not a ValueError) is a 400 bad_request on every route that reads JSON,
with nothing reserved and no traceback logged."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest

from tests.integration.conftest import Gw, preset_provider
from tests.support.fake_providers import FakeProvider

MakeGw = Callable[..., Awaitable[Gw]]

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


#: an answer just within what the gateway quotes of it (ANSWER_EXCERPT)
SHALLOW_DEEP = b"[" * 990 + b"]" * 990


@pytest.mark.parametrize("answer", [DEEP, SHALLOW_DEEP], ids=["deep", "within_excerpt"])
@pytest.mark.parametrize("status,code", [(200, None), (422, "provider_rejected")])
async def test_a_providers_deeply_nested_answer_is_judged_not_a_500(
        make_gw: MakeGw, fakes: dict[str, FakeProvider], caplog: pytest.LogCaptureFixture,
        answer: bytes, status: int, code: str | None) -> None:
    """An email API's answer is parsed as JSON to find its message id; one
    nested deeper than the parser recurses is an answer that is not the JSON
    expected (text), not an error of the gateway: the email was sent (or
    refused) and is answered and recorded so, never 500 with the key left
    in flight."""
    gw = await make_gw(providers={"resend": preset_provider("resend", fakes["resend"])})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    fakes["resend"].fail_next(status, answer, acted=True)
    with caplog.at_level(logging.INFO):
        got, _, body = await gw.email(lease, "k-deep-answer", body={"provider": "resend"})
    assert len(fakes["resend"].sent) == 1
    if code is None:
        assert got == 200 and body["status"] == "sent", body
    else:
        assert got == 422 and body["code"] == code, body
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    state = await gw.effect_state_after("k-deep-answer")
    assert state == ("succeeded" if code is None else "failed")
    again, headers, _ = await gw.email(lease, "k-deep-answer", body={"provider": "resend"})
    assert again == got and headers["Idempotent-Replayed"] == "true"
    assert len(fakes["resend"].sent) == 1
