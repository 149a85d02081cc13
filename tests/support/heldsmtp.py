"""An SMTP server whose host holds the message its server has not read yet.

``HeldSmtp()`` answers a plain SMTP conversation (220, EHLO, MAIL, RCPT,
DATA, RSET, NOOP, QUIT) and accepts each message at its final dot
(recorded in ``accepted``). After its 354 to DATA it stops reading until
``release()``: what the gateway sends waits in this host's kernel receive
queue (at most ``receive_buffer``, set on the listening socket so the window
is small and known), then in the gateway's. A released connection reads on:
whatever its kernel accepted, and whatever else the gateway still sends.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field


@dataclass
class HeldSmtpConn:
    transport: asyncio.Transport | None = None
    held: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class _Session(asyncio.Protocol):
    def __init__(self, server: HeldSmtp) -> None:
        self.server = server
        self.conn = HeldSmtpConn()
        server.conns.append(self.conn)
        self.buffer = b""
        self.in_data = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn.transport = transport  # type: ignore[assignment]
        self._say(b"220 held ESMTP")

    def _say(self, line: bytes) -> None:
        assert self.conn.transport is not None
        if not self.conn.transport.is_closing():
            self.conn.transport.write(line + b"\r\n")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.in_data:
                end = self.buffer.find(b"\r\n.\r\n")
                if end < 0:
                    return
                self.server.accepted.append(self.buffer[:end])
                self.buffer = self.buffer[end + 5:]
                self.in_data = False
                self._say(b"250 2.0.0 queued")
                continue
            line, sep, rest = self.buffer.partition(b"\r\n")
            if not sep:
                return
            self.buffer = rest
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                self._say(b"250 held")
            elif verb == b"DATA":
                self.in_data = True
                self._say(b"354 go ahead")
                if not self.server.released:
                    assert self.conn.transport is not None
                    self.conn.held = True
                    self.conn.transport.pause_reading()
                    return
            elif verb == b"QUIT":
                self._say(b"221 bye")
            else:  # MAIL, RCPT, RSET, NOOP
                self._say(b"250 ok")

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.ended.set()


class HeldSmtp:
    def __init__(self, receive_buffer: int = 64 * 1024) -> None:
        self.receive_buffer = receive_buffer
        self.released = False
        #: every message accepted (at its final dot), in order
        self.accepted: list[bytes] = []
        self.conns: list[HeldSmtpConn] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> HeldSmtp:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # before listen(): accepted sockets inherit it (the window the gateway sees)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Session(self), sock=sock)
        self.port = sock.getsockname()[1]
        return self

    def release(self) -> None:
        """The server reads its held connections again."""
        self.released = True
        for conn in self.conns:
            if conn.held and conn.transport is not None and not conn.transport.is_closing():
                conn.transport.resume_reading()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.abort()
                await conn.ended.wait()
        if self._server is not None:
            await self._server.wait_closed()
