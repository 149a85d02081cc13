"""The gateway resends within a provider's window only to the endpoints that
provider dedupes on. Resend dedupes on ``Idempotency-Key`` only on ``POST
/emails`` and ``POST /emails/batch``
(https://resend.com/docs/dashboard/emails/idempotency-keys); a request to any
other endpoint through ``/v1/http/resend/...`` is never resent, since there a
resend would be a second action.

Real gateway, real PostgreSQL, a fake Resend on loopback (the presets'
fake, plus the broadcasts endpoint, which acts on every request).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from tests.integration.conftest import Gw, preset_provider
from tests.support.fake_providers import FakeResend
from tests.support.fake_providers.base import json_answer
from tests.support.fake_providers.resend import error

MakeGw = Callable[..., Awaitable[Gw]]


class ResendWithBroadcasts(FakeResend):
    """Resend, with ``POST /broadcasts/{id}/send``
    (https://resend.com/docs/api-reference/broadcasts/send-broadcast): it
    sends the broadcast to its whole audience on every request; the
    idempotency key is not looked at on this endpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.broadcasts_sent: list[str] = []

    def routes(self) -> list[tuple[str, str, object]]:  # type: ignore[override]
        return [*super().routes(), ("POST", "/broadcasts/{id}/send", self.send_broadcast)]

    async def send_broadcast(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization", "") != f"Bearer {self.secret}":
            return error(403, "invalid_api_key", "API key is invalid.")
        await request.read()
        self.broadcasts_sent.append(request.match_info["id"])
        return json_answer({"id": request.match_info["id"]})


@pytest.fixture
async def resend_api() -> AsyncIterator[ResendWithBroadcasts]:
    fake = ResendWithBroadcasts()
    await fake.start()
    yield fake
    await fake.close()


async def test_a_resend_endpoint_that_ignores_the_key_is_never_resent(
        make_gw: MakeGw, resend_api: ResendWithBroadcasts) -> None:
    """A broadcast is sent, Resend's answer is lost (the connection drops
    after it acted). The outcome is unknown; the gateway must not send it
    again, since Resend does not dedupe this endpoint on our key: the
    broadcast would go to the whole audience twice."""
    gw = await make_gw(providers={"resend": preset_provider("resend", resend_api)})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    resend_api.lose_answers = ["close"]
    status, _, body = await gw.post("/v1/http/resend/broadcasts/bc-1/send",
                                    gw.headers(lease, "broadcast-1"), json={})
    assert resend_api.broadcasts_sent == ["bc-1"], (
        f"the broadcast was sent {len(resend_api.broadcasts_sent)} times for one key "
        f"(answer {status} {body})")
    assert (status, body["code"]) == (504, "provider_timeout"), body
