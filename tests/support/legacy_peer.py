"""A legacy HTTP provider on loopback: it answers every request 200 with a
``Content-Disposition`` header in Latin-1 (obs-text, which HTTP allows),
behind a gateway that sends to it as provider ``legacy``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.integration.conftest import PROVIDER_TIMEOUT, Gw

LATIN1_ANSWER = (b"HTTP/1.1 200 OK\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Content-Disposition: attachment; filename=\"r\xe9sum\xe9.pdf\"\r\n"
                 b"Content-Length: 12\r\n"
                 b"Connection: close\r\n\r\n"
                 b"{\"ok\": true}")


class LegacyPeer:
    """A real HTTP peer on loopback that answers every request 200 with a
    Latin-1 Content-Disposition, and counts the requests."""

    def __init__(self) -> None:
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length, chunked = 0, False
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                if name.strip().lower() == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
            if chunked:
                await reader.readuntil(b"0\r\n\r\n")
            elif length:
                await reader.readexactly(length)
            self.requests += 1
            writer.write(LATIN1_ANSWER)
            await writer.drain()
        finally:
            writer.close()

    async def start(self) -> LegacyPeer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def legacy() -> AsyncIterator[LegacyPeer]:
    peer = await LegacyPeer().start()
    yield peer
    await peer.close()


async def legacy_gateway(make_gw: Callable[..., Awaitable[Gw]], legacy: LegacyPeer) -> Gw:
    """A gateway with the legacy peer as its provider "legacy" (no idempotency)."""
    return await make_gw(providers={"legacy": {
        "kind": "http", "base_url": f"http://127.0.0.1:{legacy.port}/api",
        "timeout_seconds": PROVIDER_TIMEOUT, "rate_limit_per_second": 1000,
        "idempotency_header": ""}})
