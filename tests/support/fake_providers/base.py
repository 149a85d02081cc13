"""What every fake provider shares: a loopback aiohttp server, a record of
what it accepted, and switches that make it fail the ways its documentation
says it can.

Each fake is written from its provider's documentation (docs/providers.md
links the pages): it checks the authentication header, the request's shape,
answers the documented success and error bodies, and dedupes on the
idempotency header only where the provider documents one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web


@dataclass
class Sent:
    """One email a fake accepted, in one shape whatever its API."""

    id: str
    sender: str
    to: list[str]
    subject: str
    cc: list[str] = field(default_factory=list)
    bcc: list[str] = field(default_factory=list)
    reply_to: str | None = None
    text: str | None = None
    html: str | None = None
    #: the email's own headers (Message-ID, Fence-Token, the caller's)
    headers: dict[str, str] = field(default_factory=dict)
    #: (filename, content type, bytes)
    attachments: list[tuple[str, str, bytes]] = field(default_factory=list)
    #: the HTTP request's headers and body, as they arrived
    request_headers: dict[str, str] = field(default_factory=dict)
    request_body: bytes = b""

    def header(self, name: str) -> str | None:
        return _get(self.headers, name)

    def request_header(self, name: str) -> str | None:
        return _get(self.request_headers, name)


def _get(headers: dict[str, str], name: str) -> str | None:
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


@dataclass
class Scripted:
    """An answer a test asks for: ``acted`` says whether the fake sends the
    email before answering (a 500 after the work was done) or not."""

    status: int
    body: Any
    acted: bool = False
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeProvider:
    """Subclasses add their routes in ``routes`` and call ``accept`` for each
    email they would send."""

    #: the environment variable the tests put this fake's secret in
    secret_env = ""
    secret = ""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        #: every request that reached the fake, accepted or not: (method, path)
        self.requests: list[tuple[str, str]] = []
        #: answers to give next, in order, instead of the normal one
        self.script: list[Scripted] = []
        #: seconds to wait after acting, before answering (a slow provider)
        self.delay = 0.0
        #: how the next answers of requests it acted on are lost, in order:
        #: "close" drops the connection, "stall" never answers (until close)
        self.lose_answers: list[Literal["close", "stall"]] = []
        #: awaited with each request as it arrives, before it is handled
        self.on_request: Callable[[web.Request], Awaitable[None]] | None = None
        self._closing = asyncio.Event()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- for tests ---------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, status: int, body: Any = None, *, acted: bool = False,
                  headers: dict[str, str] | None = None) -> None:
        self.script.append(Scripted(status, body, acted, headers or {}))

    async def start(self) -> FakeProvider:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for method, path, handler in self.routes():
            app.router.add_route(method, path, self._recorded(handler))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- for subclasses ----------------------------------------------------

    def routes(self) -> list[tuple[str, str, Handler]]:
        raise NotImplementedError

    def new_id(self, template: str = "{n}") -> str:
        return template.format(n=next(self._ids))

    async def respond(self, sent: Sent | None, ok: Callable[[], web.StreamResponse]
                      ) -> web.StreamResponse:
        """Act (record ``sent``) unless a scripted answer says not to, wait
        ``delay``, then answer ``ok()`` or the scripted answer."""
        scripted = self.script.pop(0) if self.script else None
        if sent is not None and (scripted is None or scripted.acted):
            self.sent.append(sent)
        if self.delay:
            await asyncio.sleep(self.delay)
        if scripted is not None:
            return json_answer(scripted.body, scripted.status, scripted.headers)
        return ok()

    def _recorded(self, handler: Handler) -> Handler:
        async def recorded(request: web.Request) -> web.StreamResponse:
            self.requests.append((request.method, request.path))
            if self.on_request is not None:
                await self.on_request(request)
            response = await handler(request)
            if self.lose_answers and 200 <= response.status < 300:
                # it acted and remembered its answer (a key it dedupes on
                # included); the answer never reaches the caller
                if self.lose_answers.pop(0) == "stall":
                    await self._closing.wait()
                elif request.transport is not None:
                    request.transport.abort()
            return response
        return recorded


def json_answer(body: Any, status: int = 200, headers: dict[str, str] | None = None
                ) -> web.Response:
    if body is None:
        return web.Response(status=status, headers=headers)
    if isinstance(body, bytes):  # as it is: JSON no encoder would make
        return web.Response(status=status, body=body, content_type="application/json",
                            headers=headers)
    return web.Response(status=status, body=json.dumps(body).encode(),
                        content_type="application/json", headers=headers)


def address_list(value: Any) -> list[str]:
    """A field that is one address, a list of them, or a comma-separated string."""
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return [a.strip() for a in str(value).split(",") if a.strip()]
