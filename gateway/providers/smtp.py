"""Email over SMTP (aiosmtplib), with a small connection pool per provider.

The conversation is driven step by step so the gateway knows how far it got:
a failure before DATA means nothing was sent (safe to retry); a failure during
DATA means the message may have been accepted (unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from dataclasses import replace
from typing import Any

import aiosmtplib

from gateway.config import SmtpProviderConfig
from gateway.effects.deadline import SEND_MARGIN_SECONDS, Deadline
from gateway.effects.fingerprint import message_id
from gateway.providers import sockets, write_guard
from gateway.providers.base import EmailCall, Outcome, ProviderCall, problem_outcome, too_late
from gateway.providers.mime import build_message

__all__ = ["SmtpProvider", "build_message"]

log = logging.getLogger("fencegate.gateway.smtp")

class _StaleConnection(Exception):
    """A pooled connection was found closed before anything was sent."""


_DISCONNECTS = (aiosmtplib.SMTPServerDisconnected, ConnectionError, OSError)


#: the queue id most relays put in their answer to DATA ("250 2.0.0 Ok: queued as 4Xy1")
_QUEUED_AS = re.compile(r"\bqueued as <?([A-Za-z0-9][A-Za-z0-9._@-]{0,127})>?", re.IGNORECASE)


def _sent(provider: str, mid: str, code: int, message: str,
          refused: dict[str, str]) -> Outcome:
    queued = _QUEUED_AS.search(message)
    body = {"status": "sent", "message_id": mid, "provider": provider,
            "provider_message_id": queued.group(1) if queued else None,
            "provider_response": {"code": code, "message": message[:500],
                                  "refused_recipients": refused}}
    return Outcome("succeeded", 200, json.dumps(body).encode(),
                   {"Content-Type": "application/json"},
                   f"smtp {code}" + (f", {len(refused)} recipients refused" if refused else ""))


def _refusal(e: aiosmtplib.SMTPResponseException, step: str) -> Outcome:
    if 500 <= e.code < 600:
        return problem_outcome("failed", "provider_rejected",
                        f"the SMTP server refused the message at {step}: {e.code}",
                        f"smtp {e.code} at {step}", provider_status=e.code)
    return problem_outcome("free", "provider_error",
                    f"the SMTP server deferred the message at {step}: {e.code}; nothing was "
                    "sent, retry later", f"smtp {e.code} at {step}", provider_status=e.code)


def _gate(conn: aiosmtplib.SMTP) -> None:
    """Pass every later write of this connection through the attempt's gate
    (after any STARTTLS, which needs the bare transport)."""
    protocol = conn.protocol
    if protocol is not None and protocol.transport is not None \
            and not isinstance(protocol.transport, write_guard.GatedTransport):
        protocol.transport = write_guard.GatedTransport(protocol.transport)  # type: ignore[assignment]


class _Connection(aiosmtplib.SMTP):
    """An SMTP connection that resets rather than closes (sockets.py): a
    message cut by the deadline is dropped by both kernels, never finished
    later from the send queue."""

    async def connect(self, *args: Any, **kwargs: Any) -> aiosmtplib.SMTPResponse:
        response = await super().connect(*args, **kwargs)
        try:
            sockets.prepare(self.get_transport_info("socket"), self.timeout or 60.0)
        except BaseException:
            self.close()
            raise
        return response

    def close(self) -> None:
        # the gated wrapper's abort counts what asyncio drops (write_guard.py); any
        # transport's abort resets (uvloop's are no asyncio.Transport)
        gated = self.protocol.transport if self.protocol is not None else None
        if isinstance(gated, write_guard.GatedTransport):
            gated.abort()
        elif self.transport is not None and hasattr(self.transport, "abort"):
            self.transport.abort()
        super().close()


class SmtpProvider:
    def __init__(self, config: SmtpProviderConfig) -> None:
        self.config = config
        self._idle: list[aiosmtplib.SMTP] = []
        self._slots = asyncio.Semaphore(config.pool_size)

    async def start(self) -> None:
        pass  # connections are opened on demand

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.quit(), 1)
            conn.close()

    async def _connect(self) -> aiosmtplib.SMTP:
        c = self.config
        conn = _Connection(
            hostname=c.host, port=c.port, timeout=c.timeout_seconds,
            use_tls=c.tls == "tls", start_tls=True if c.tls == "starttls" else False,
            username=c.username, password=c.password, cert_bundle=c.ca_file,
        )
        await conn.connect()
        return conn

    async def send(self, call: ProviderCall, deadline: Deadline) -> Outcome:
        assert isinstance(call, EmailCall), "an SMTP provider sends emails"
        req = call.email
        data = call.message or build_message(call, self.config.idempotency_header)
        sender = req.envelope_sender
        step = ["connect"]
        # the wait for a connection counts against the attempt's deadline too
        try:
            async with asyncio.timeout(max(0.0, deadline.remaining() - SEND_MARGIN_SECONDS)):
                await self._slots.acquire()
        except TimeoutError:
            return too_late(self.config.name, "an SMTP connection")
        writes = write_guard.WriteGate(deadline)
        token = write_guard.CURRENT.set(writes)
        try:
            async with asyncio.timeout(deadline.bound(self.config.timeout_seconds)):
                return await self._deliver(call, sender, req.recipients, data, step, deadline)
        except write_guard.GateClosed:
            # refused before the message's final dot left: the server holds no
            # complete message, and drops what it has with the connection
            return too_late(self.config.name, "the SMTP conversation")
        except TimeoutError:
            if step[0] == "data":
                # reset by now: what asyncio still held of the message (its final
                # dot, at least) was dropped, or the server's host may hold it whole
                return replace(problem_outcome(
                    "unknown", "provider_timeout", "the SMTP server did not answer in time "
                    "after the message was sent; its outcome is unknown",
                    "smtp timeout in DATA"), request_never_whole=writes.never_whole())
            return problem_outcome("free", "provider_error",
                            f"the SMTP server did not answer in time at {step[0]}; nothing "
                            "was sent", f"smtp timeout at {step[0]}")
        finally:
            writes.end()
            write_guard.CURRENT.reset(token)
            self._slots.release()

    async def _deliver(self, call: ProviderCall, sender: str, recipients: list[str],
                       data: bytes, step: list[str], deadline: Deadline) -> Outcome:
        for attempt in range(2):
            step[0] = "connect"
            pooled = bool(self._idle)
            try:
                conn = self._idle.pop() if pooled else await self._connect()
            except aiosmtplib.SMTPResponseException as e:
                # greeting, STARTTLS or AUTH refused: nothing was sent, and the
                # key must stay usable once the operator fixes the settings
                return problem_outcome("free", "provider_error",
                                       f"the SMTP server refused the connection: {e.code}; "
                                       "nothing was sent", f"smtp {e.code} at connect",
                                       provider_status=e.code)
            except (*_DISCONNECTS, aiosmtplib.SMTPException) as e:
                return problem_outcome("free", "provider_error",
                                f"cannot connect to the SMTP server: {type(e).__name__}",
                                "smtp connect failed")
            try:
                return await self._converse(conn, pooled and attempt == 0, call, sender,
                                            recipients, data, step, deadline)
            except _StaleConnection:
                continue
            except BaseException:
                conn.close()  # cancelled (the deadline) or worse: never reuse it
                raise
        raise AssertionError("unreachable")

    async def _converse(self, conn: aiosmtplib.SMTP, may_be_stale: bool, call: ProviderCall,
                        sender: str, recipients: list[str], data: bytes,
                        step: list[str], deadline: Deadline) -> Outcome:
        _gate(conn)
        step[0] = "envelope"
        try:
            outcome = await self._envelope(conn, sender, recipients)
        except _DISCONNECTS:
            conn.close()
            if may_be_stale:
                raise _StaleConnection from None  # nothing was sent: try a fresh one
            return problem_outcome("free", "provider_error",
                            "the SMTP server closed the connection before the message "
                            "was sent", "smtp disconnect before DATA")
        if isinstance(outcome, Outcome):
            await self._recycle(conn, reset=True)
            return outcome
        if not deadline.can_start():  # the last moment to hold back: nothing sent yet
            await self._recycle(conn, reset=True)
            return too_late(self.config.name, "the SMTP server's envelope replies")
        step[0] = "data"
        try:
            response = await conn.data(data)
        except aiosmtplib.SMTPResponseException as e:
            await self._recycle(conn, reset=True)
            return _refusal(e, "DATA")
        except _DISCONNECTS as e:
            conn.close()
            return problem_outcome("unknown", "provider_timeout",
                            f"the SMTP connection was lost during DATA ({type(e).__name__});"
                            " the message may have been accepted", "smtp lost in DATA")
        await self._recycle(conn, reset=False)
        return _sent(self.config.name, message_id(call.client, call.key), response.code,
                     response.message, outcome)

    async def _envelope(self, conn: aiosmtplib.SMTP, sender: str,
                        recipients: list[str]) -> Outcome | dict[str, str]:
        """MAIL and RCPT. Answers the refused recipients, or the Outcome that ends
        the effect before DATA."""
        try:
            await conn.mail(sender)
        except aiosmtplib.SMTPResponseException as e:
            return _refusal(e, "MAIL FROM")
        refused: dict[str, str] = {}
        for rcpt in recipients:
            try:
                await conn.rcpt(rcpt)
            except aiosmtplib.SMTPResponseException as e:
                if not 500 <= e.code < 600:
                    # deferred for one recipient: sending to the others now would
                    # make a retry a duplicate for them, so send to nobody
                    return _refusal(e, "RCPT TO")
                refused[rcpt] = f"{e.code} {e.message[:200]}"
        if len(refused) == len(recipients):
            return problem_outcome("failed", "provider_rejected",
                            "the SMTP server refused every recipient",
                            "smtp refused all recipients", refused_recipients=refused)
        return refused

    async def _recycle(self, conn: aiosmtplib.SMTP, reset: bool) -> None:
        try:
            if reset:
                await conn.rset()
        except (*_DISCONNECTS, aiosmtplib.SMTPException):
            conn.close()
            return
        if conn.is_connected and len(self._idle) < self.config.pool_size:
            self._idle.append(conn)
        else:
            conn.close()
