"""The dev sinks (gateway/dev/sinks.py) with a moment a test controls: an
answer held until the test has done what must happen while the provider
has the request, instead of a delay it hopes is long enough."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.dev import sinks


class SmtpSink(sinks.SmtpSink):
    """``hold``: while set to an unset event, each message's DATA waits for
    it before the message is taken (and answered)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.hold: asyncio.Event | None = None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.hold is not None:
            await self.hold.wait()
        return await super().handle_DATA(server, session, envelope)


class WebhookSink(sinks.WebhookSink):
    """``before_answer``: awaited with each request as it arrives, before it
    is recorded and answered."""

    def __init__(self) -> None:
        super().__init__()
        self.before_answer: Callable[[web.Request], Awaitable[None]] | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.before_answer is not None:
            await self.before_answer(request)
        return await super()._handle(request)
