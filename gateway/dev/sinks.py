"""Local peers that record what reaches them: an SMTP sink (aiosmtpd) and a
webhook sink (aiohttp). ``fencegate dev`` runs them; the tests drive them.

Each can be told how to answer (a status, a delay) to play a failing provider.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import ssl
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session


@dataclass
class Delivery:
    """One message or request that reached a sink."""

    headers: dict[str, str]
    body: bytes
    recipients: list[str] = field(default_factory=list)
    #: the SMTP envelope's sender (MAIL FROM), for a message
    mail_from: str = ""
    method: str = ""
    path: str = ""
    received_at: float = field(default_factory=time.monotonic)
    #: when the sink finished answering (after any delay)
    answered_at: float | None = None
    #: False when a sink that dedupes saw this key inside its window
    acted: bool = True

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        for k, v in self.headers.items():
            if k.lower() == lowered:
                return v
        return None


class SmtpSink:
    """An aiosmtpd server on this event loop that keeps every accepted message.

    ``starttls`` (an SSL context) offers and requires STARTTLS; ``implicit_tls``
    speaks TLS from the first byte; ``credentials`` requires AUTH with them."""

    def __init__(self, *, starttls: ssl.SSLContext | None = None,
                 implicit_tls: ssl.SSLContext | None = None,
                 credentials: tuple[str, str] | None = None) -> None:
        self.starttls, self.implicit_tls, self.credentials = starttls, implicit_tls, credentials
        self.deliveries: list[Delivery] = []
        #: answer to DATA instead of accepting, e.g. "550 no such user"
        self.data_reply: str | None = None
        #: answer to RCPT for these addresses, e.g. {"x@y": "550 unknown"}
        self.rcpt_replies: dict[str, str] = {}
        #: seconds to wait before answering DATA (after reading the message)
        self.data_delay = 0.0
        #: per message, in order, instead of data_delay while any are left
        self.next_data_delays: list[float] = []
        #: seconds to wait before answering each RCPT (the message comes after)
        self.envelope_delay = 0.0
        #: a header the sink dedupes on, as an email API does, for this long
        #: after it first saw a value; a deduped message is recorded with
        #: ``acted=False``
        self.dedupe_header: str | None = None
        self.dedupe_window = 0.0
        self._first_seen: dict[str, float] = {}
        self._server: asyncio.Server | None = None
        self._sessions: weakref.WeakSet[SMTP] = weakref.WeakSet()
        self.port = 0

    def _authenticate(self, server: SMTP, session: Session, envelope: Envelope,
                      mechanism: str, auth_data: Any) -> AuthResult:
        assert self.credentials is not None
        login, password = self.credentials
        ok = isinstance(auth_data, LoginPassword) and \
            auth_data.login == login.encode() and auth_data.password == password.encode()
        return AuthResult(success=ok, handled=False)

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        if self.envelope_delay:
            await asyncio.sleep(self.envelope_delay)
        reply = self.rcpt_replies.get(address)
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        """A message has arrived: it is recorded now (it has landed, whatever
        happens to the answer), then answered after any delay."""
        delay = self.next_data_delays.pop(0) if self.next_data_delays else self.data_delay
        if self.data_reply:
            await asyncio.sleep(delay)
            return self.data_reply
        content = envelope.original_content or b""
        msg = email.message_from_bytes(content, policy=email.policy.default)
        delivery = Delivery(headers={k: str(v) for k, v in msg.items()}, body=content,
                            recipients=list(envelope.rcpt_tos),
                            mail_from=envelope.mail_from or "")
        if self.dedupe_header and msg[self.dedupe_header]:
            key = str(msg[self.dedupe_header])
            first = self._first_seen.get(key)
            delivery.acted = first is None or delivery.received_at - first > self.dedupe_window
            if delivery.acted:
                self._first_seen[key] = delivery.received_at
        self.deliveries.append(delivery)
        if delay:
            await asyncio.sleep(delay)
        delivery.answered_at = time.monotonic()
        return "250 Message accepted for delivery"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> SmtpSink:
        loop = asyncio.get_running_loop()
        kwargs: dict[str, Any] = {}
        if self.starttls is not None:
            kwargs.update(tls_context=self.starttls, require_starttls=True)
        if self.credentials is not None:
            kwargs.update(authenticator=self._authenticate, auth_required=True)

        def session() -> SMTP:
            smtp = SMTP(self, hostname="fencegate-sink", loop=loop, **kwargs)
            self._sessions.add(smtp)
            return smtp

        self._server = await loop.create_server(session, host, port, ssl=self.implicit_tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop listening and cut every connection, idle or not."""
        if self._server is not None:
            self._server.close()
            # Since Python 3.12 wait_closed() also waits for every accepted
            # connection to end, and a client may keep one open for as long as
            # it likes (the gateway's SMTP pool does): cut them, as
            # Server.abort_clients() does on 3.13.
            for smtp in list(self._sessions):
                if isinstance(smtp.transport, asyncio.Transport):  # None once ended
                    smtp.transport.abort()
            await self._server.wait_closed()


class WebhookSink:
    """An aiohttp server that records every request and answers as told."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.status = 200
        self.delay = 0.0
        self.reply: Any = {"ok": True}
        self.reply_headers: dict[str, str] = {}
        #: called with each delivery as it arrives (tests hook faults onto it)
        self.on_request: Callable[[Delivery], None] | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        delivery = Delivery(headers=dict(request.headers), body=body, method=request.method,
                            path=request.path_qs)
        self.deliveries.append(delivery)
        if self.on_request is not None:
            self.on_request(delivery)
        if self.delay:
            await asyncio.sleep(self.delay)
        response = web.json_response(self.reply, status=self.status,
                                     headers=self.reply_headers)
        await response.prepare(request)
        await response.write_eof()
        delivery.answered_at = time.monotonic()
        return response

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> WebhookSink:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
