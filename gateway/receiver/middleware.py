"""The receiver's check as an aiohttp middleware."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway.receiver.verify import Delivery, Refused, Verifier

__all__ = ["DELIVERY", "fence_middleware", "refusal_response"]

#: the checked delivery, on the request: ``request[DELIVERY].fence``
DELIVERY: Final = web.RequestKey("fencegate_delivery", Delivery)


def refusal_response(refused: Refused) -> web.Response:
    """The answer to a refused request: its problem document."""
    return web.Response(status=refused.status, body=json.dumps(refused.document()).encode(),
                        content_type="application/problem+json")


def fence_middleware(verifier: Verifier, *, admit: bool = True,
                     applies: Callable[[web.Request], bool] | None = None) -> Middleware:
    """Check every request (or those ``applies`` picks) before its handler:
    refused, the handler never runs. ``admit=False`` checks the signatures
    only; the handler then calls ``verifier.admit(request[DELIVERY],
    PostgresFences(conn))`` in its own transaction, so the fence and its
    writes commit together."""
    if admit and verifier.fences is None:
        raise ValueError("fence_middleware(admit=True) needs a Verifier with a FenceStore")

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if applies is not None and not applies(request):
            return await handler(request)
        try:
            delivery = verifier.authenticate(request.headers, await request.read())
            if admit:
                await verifier.admit(delivery)
        except Refused as refused:
            return refusal_response(refused)
        request[DELIVERY] = delivery
        return await handler(request)

    return middleware
