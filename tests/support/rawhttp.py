"""Raw HTTP on the socket, for requests a well-behaved client would never
send."""

from __future__ import annotations

import asyncio

from tests.integration.conftest import Gw


async def raw(gw: Gw, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as it is to the gateway; its status (0: none) and bytes."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data
