"""Where providers and bodies broke "one key, one effect" (issues 9 and 18):
a client library's silent resend, a resend landing past the provider's
window, a load balancer's 504, whole bodies both ways, signatures the
reference library checks."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from tests.integration.conftest import API_KEY, Gw
from tests.support.rawhttp import raw
from tests.support.waiting import until


class ActsThenDrops:
    """A provider that reads each request, acts on it (records it), then
    drops the connection without a word: the worst case for a retry."""

    def __init__(self) -> None:
        self.acted: list[tuple[str, str]] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> ActsThenDrops:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, path, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            self.acted.append((method, path))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.transport.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def dropper() -> AsyncIterator[ActsThenDrops]:
    d = await ActsThenDrops().start()
    yield d
    await d.close()


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
async def test_every_attempt_is_one_request_on_the_wire(
    make_gw: Callable[..., Awaitable[Gw]], dropper: ActsThenDrops, method: str,
) -> None:
    """aiohttp resent GET, PUT and DELETE once when the connection dropped
    after the request: a provider that acted and then lost the connection
    acted twice, and the caller was told 200 and had it stored."""
    gw = await make_gw(providers={"raw": {
        "kind": "http", "base_url": f"http://127.0.0.1:{dropper.port}/api",
        "timeout_seconds": 2, "rate_limit_per_second": 1000, "idempotency_header": ""}})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    body = {} if method in ("POST", "PUT", "PATCH") else None
    status, _, answer = await gw.request(method, "/v1/http/raw/charge",
                                         gw.headers(lease, f"k-{method}"), json=body)
    assert dropper.acted == [(method, "/api/charge")]
    assert (status, answer["code"]) == (504, "provider_timeout")  # outcome unknown
    again = await gw.request(method, "/v1/http/raw/charge", gw.headers(lease, f"k-{method}"),
                             json=body)
    assert (again[0], again[2]["code"]) == (409, "effect_outcome_unknown")
    assert len(dropper.acted) == 1


async def test_a_load_balancers_504_leaves_the_outcome_unknown(gw: Gw) -> None:
    """A 504 from a proxy in front of the provider comes after the provider
    may have acted: the key must not be freed for a second send."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    gw.hook.status = 504
    status, _, body = await gw.request("POST", "/v1/http/hook/x", gw.headers(lease, "lb"),
                                       json={})
    assert (status, body["code"], body["provider_status"]) == (504, "provider_timeout", 504)
    gw.hook.status = 200
    status, _, body = await gw.request("POST", "/v1/http/hook/x", gw.headers(lease, "lb"),
                                       json={})
    assert (status, body["code"]) == (409, "effect_outcome_unknown")
    assert len(gw.hook.deliveries) == 1


async def test_a_resend_is_not_admitted_if_it_could_land_past_the_providers_window(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """The email provider dedupes our key for 3 s. The first attempt timed out
    (it acted); the caller repeated the key 1 s later, inside the window, and
    it was admitted, but it waited for the one SMTP connection and reached
    the provider after the window had closed: the provider acted twice."""
    header = "Resend-Idempotency-Key"
    gw = await make_gw(providers={"mail": {"pool_size": 1, "idempotency_header": header,
                                           "idempotency_window_seconds": 3}})
    gw.smtp.dedupe_header, gw.smtp.dedupe_window = header, 3.0
    lease = await gw.leases.claim("run:1", ttl=60)
    other = await gw.leases.claim("run:2", ttl=60)
    assert lease is not None and other is not None
    gw.smtp.next_data_delays = [1.5]  # answered after the gateway's 1 s timeout
    status, _, body = await gw.email(lease, "once")
    assert (status, body["code"]) == (504, "provider_timeout")
    gw.smtp.next_data_delays = [2.5]  # the next message holds the only connection
    busy = asyncio.create_task(gw.email(other, "busy"))
    # the busy message has reached the sink: it holds the only connection
    await until(lambda: any(d.header("Fence-Resource") == "run:2"
                            for d in gw.smtp.deliveries), "the busy message at the sink")
    status, _, body = await gw.email(lease, "once")
    assert (status, body["code"]) == (409, "effect_outcome_unknown"), body
    await busy
    # a message sent through the only connection after them all: whatever
    # was admitted before it has had its turn at the sink
    gw.smtp.next_data_delays = []
    after = await gw.leases.claim("run:3", ttl=60)
    assert after is not None
    assert (await gw.email(after, "after"))[0] == 200
    acted = [d for d in gw.smtp.deliveries if d.header(header) and d.acted
             and d.header("Fence-Resource") == "run:1"]
    assert len(acted) == 1


async def test_a_resend_well_inside_the_window_is_still_made(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    header = "Resend-Idempotency-Key"
    gw = await make_gw(providers={"mail": {"idempotency_header": header,
                                           "idempotency_window_seconds": 3600}})
    gw.smtp.dedupe_header, gw.smtp.dedupe_window = header, 3600.0
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    gw.smtp.next_data_delays = [1.5]
    assert (await gw.email(lease, "again"))[0] == 504
    status, _, body = await gw.email(lease, "again")
    assert status == 200, body
    # no wait: the sink records a message when its DATA ends, before it
    # answers, and both attempts have their answer (or timed out on it)
    assert [d.acted for d in gw.smtp.deliveries] == [True, False]


async def _chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]
        await asyncio.sleep(0)


async def test_a_chunked_upload_reaches_the_provider_whole(gw: Gw) -> None:
    """A chunked 51,200-byte upload used to reach the provider as its first
    8,192 bytes, answered 200."""
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    payload = bytes(range(256)) * 200
    status, _, _ = await gw.request("POST", "/v1/http/hook/upload",
                                    {**gw.headers(lease, "chunked"),
                                     "Content-Type": "application/octet-stream"},
                                    data=_chunks(payload))
    assert status == 200
    [d] = gw.hook.deliveries
    assert d.body == payload


async def test_a_chunked_upload_over_the_limit_is_refused_and_sends_nothing(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    status, _, body = await gw.request("POST", "/v1/http/hook/upload",
                                       gw.headers(lease, "too-big"),
                                       data=_chunks(b"x" * 200_000))
    assert (status, body["code"]) == (413, "payload_too_large")
    assert gw.hook.deliveries == []


async def test_an_answer_written_in_pieces_is_stored_and_replayed_whole(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """A provider answer that arrives in 30 pieces was stored, and replayed,
    as its first piece."""
    answer = json.dumps({"items": [{"n": i, "pad": "y" * 40} for i in range(200)]}).encode()

    async def pieces(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        step = len(answer) // 30 + 1
        for i in range(0, len(answer), step):
            await resp.write(answer[i:i + step])
            await asyncio.sleep(0.005)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", pieces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        gw = await make_gw(providers={"pieces": {
            "kind": "http", "base_url": f"http://127.0.0.1:{port}/api",
            "timeout_seconds": 5, "rate_limit_per_second": 1000}})
        lease = await gw.leases.claim("run:1", ttl=30)
        assert lease is not None
        first = await gw.request("GET", "/v1/http/pieces/list", gw.headers(lease, "list-1"))
        again = await gw.request("GET", "/v1/http/pieces/list", gw.headers(lease, "list-1"))
    finally:
        await runner.cleanup()
    assert first[0] == 200 and first[2] == json.loads(answer)
    assert again[1]["Idempotent-Replayed"] == "true" and again[2] == json.loads(answer)


async def test_a_body_that_never_finishes_arriving_is_refused_in_time(
    make_gw: Callable[..., Awaitable[Gw]],
) -> None:
    """A client that announces 100 bytes and sends 10 used to hold its
    request (and a connection) for as long as it liked."""
    gw = await make_gw(body_timeout_seconds=0.5)
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    head = [f"{k}: {v}" for k, v in gw.headers(lease, "slow-body").items()]
    request = ("\r\n".join(["POST /v1/http/hook/x HTTP/1.1", "Host: x", "Connection: close",
                            "Content-Length: 100", *head]) + "\r\n\r\n").encode() + b"0123456789"
    status, data = await asyncio.wait_for(raw(gw, request), 10)
    assert status == 408 and b"request_timeout" in data
    assert gw.hook.deliveries == []


async def test_signatures_verify_with_the_standard_webhooks_reference_library(
    make_gw: Callable[..., Awaitable[Gw]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Secrets without the whsec_ prefix were used as raw bytes; the reference
    library base64-decodes every secret, so receivers rejected our signatures."""
    from standardwebhooks import Webhook

    raw_secret = base64.b64encode(b"a-32-byte-signing-secret-for-us!").decode()
    monkeypatch.setenv("TEST_PLAIN_SECRET", raw_secret)
    port = (await make_gw()).hook.port  # the sink behind every test provider
    gw = await make_gw(providers={
        "plain": {"kind": "http", "base_url": f"http://127.0.0.1:{port}/plain",
                  "rate_limit_per_second": 1000, "signing_secret_env": "TEST_PLAIN_SECRET"}})
    lease = await gw.leases.claim("run:1", ttl=30)
    assert lease is not None
    for provider, key in (("plain", "sig-plain"), ("signed", "sig-prefixed")):
        status, _, _ = await gw.request("POST", f"/v1/http/{provider}/evt",
                                        gw.headers(lease, key), json={"n": 1})
        assert status == 200
    from tests.integration.conftest import SIGNING_SECRET

    for d, secret in zip(gw.hook.deliveries, (raw_secret, SIGNING_SECRET), strict=True):
        headers = {k: v for k, v in d.headers.items() if k.lower().startswith("webhook-")}
        assert Webhook(secret).verify(d.body, headers) == {"n": 1}
    assert API_KEY not in json.dumps([d.headers for d in gw.hook.deliveries])
