"""Peers for the benchmarks, each in its own process:

    python -m bench.peers sink PORT             an aiohttp endpoint answering {"ok": true}
    python -m bench.peers proxy PORT UPSTREAM   a bare aiohttp pass-through proxy, no fencing
    python -m bench.peers smtp PORT             an aiosmtpd sink that accepts everything
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
from aiohttp import web

from gateway.dev.sinks import SmtpSink


async def sink(port: int) -> None:
    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def proxy(port: int, upstream: str) -> None:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length", "connection")}
        async with session.request(request.method, upstream + request.path_qs, data=body,
                                   headers=headers) as resp:
            data = await resp.read()
            return web.Response(status=resp.status, body=data,
                                content_type=resp.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def smtp(port: int) -> None:
    s = await SmtpSink().start(port=port)

    async def trim() -> None:  # keep memory flat over long runs
        while True:
            await asyncio.sleep(1)
            s.deliveries.clear()

    await trim()


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "sink":
        asyncio.run(sink(port))
    elif kind == "proxy":
        asyncio.run(proxy(port, sys.argv[3]))
    else:
        asyncio.run(smtp(port))
