"""What a handler knows of its request: the gateway, the client that sent
it, and its body, read whole within the limits before it takes its slot."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.api import parsing
from gateway.api.bodies import receive
from gateway.config import ClientConfig
from gateway.effects import slots
from gateway.state import GATEWAY, Gateway

#: the client a request authenticated as (set by app.py's middleware)
CLIENT = web.RequestKey("client", ClientConfig)


def gw_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY]


def client_of(request: web.Request) -> ClientConfig:
    client: ClientConfig = request[CLIENT]
    return client


async def read_body(request: web.Request) -> bytes:
    """The whole request body (chunked or not), within the size and time
    limits; then the request takes its slot (gateway/effects/slots.py). A client may
    be sending at most ``max_requests_in_flight`` bodies at once."""
    gw = gw_of(request)
    server = gw.config.server
    name = client_of(request).name
    limit = gw.config.max_requests_in_flight
    if gw.receiving.get(name, 0) >= limit:
        raise slots.overloaded(limit, "bodies being received for one client")
    gw.receiving[name] = gw.receiving.get(name, 0) + 1
    try:
        body = await receive(request, server.max_body_bytes, server.body_timeout_seconds)
    finally:
        gw.receiving[name] -= 1
        if not gw.receiving[name]:
            del gw.receiving[name]
    slots.take(request)
    return body


async def read_json(request: web.Request) -> Any:
    return parsing.json_value(await read_body(request))
