"""A replay hands back the header bytes the first answer had: a provider's
header that is not UTF-8 (Latin-1 obs-text) names the same file in the first
answer and in every repeat of the key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp

from tests.integration.conftest import Gw
from tests.support.legacy_peer import (  # noqa: F401
    LegacyPeer,
    legacy,
    legacy_gateway,
)


async def _raw(gw: Gw, headers: dict[str, str]) -> tuple[int, dict[bytes, bytes]]:
    async with aiohttp.ClientSession() as http, http.post(
            gw.url + "/v1/http/legacy/doc", headers=headers, json={"n": 1}) as r:
        await r.read()
        return r.status, {k.lower(): v for k, v in r.raw_headers}


async def test_a_replay_hands_back_the_header_bytes_the_first_answer_had(
    make_gw: Callable[..., Awaitable[Gw]], legacy: LegacyPeer,  # noqa: F811
) -> None:
    gw = await legacy_gateway(make_gw, legacy)
    lease = await gw.leases.claim("run:latin1", ttl=60)
    assert lease is not None

    status, first = await _raw(gw, gw.headers(lease, "latin1"))
    assert status == 200
    assert await gw.effect_state_after("latin1") == "succeeded"  # behind the answer

    status, again = await _raw(gw, gw.headers(lease, "latin1"))
    assert (status, again.get(b"idempotent-replayed")) == (200, b"true")
    assert legacy.requests == 1
    # the same answer, byte for byte: not the file name re-encoded as UTF-8
    assert again[b"content-disposition"] == first[b"content-disposition"]
