"""An HTTP provider whose host holds requests its server has not read yet.

``HeldProvider(held=N)`` listens on 127.0.0.1 and answers every complete
request (headers and a ``Content-Length`` body) 200, acting on it (recorded
in ``acted``) as it reads it. The first ``held`` connections are not read
until ``release()``: their bytes wait in this host's kernel receive queue,
acknowledged to the gateway, as they do in front of a provider that is
stalled or reads slowly. Linux keeps what a connection received even after
the peer reset it, so a released connection still yields every complete
request that reached this host before the reset, and the server acts on it,
exactly as a real one would.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

_ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
           b"Content-Length: 11\r\n\r\n{\"ok\":true}")


@dataclass
class HeldConn:
    """One connection to the provider."""

    held: bool
    transport: asyncio.Transport | None = None
    #: set once the connection is gone (reset by the gateway, or closed)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class _Server(asyncio.Protocol):
    def __init__(self, provider: HeldProvider) -> None:
        self.provider = provider
        self.buffer = b""
        self.conn = HeldConn(held=len(provider.conns) < provider.held)
        provider.conns.append(self.conn)
        provider._servers.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # not an isinstance check: uvloop's transports are not asyncio.Transport
        self.conn.transport = transport  # type: ignore[assignment]
        if self.conn.held and not self.provider.released:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.conn.held and not self.provider.released:
            # uvloop starts reading after connection_made: hold what it read
            assert self.conn.transport is not None
            self.conn.transport.pause_reading()
            return
        self.act()

    def act(self) -> None:
        while b"\r\n\r\n" in self.buffer:
            head, rest = self.buffer.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if len(rest) < length:
                return
            self.provider.acted.append(head.decode("latin-1"))
            self.buffer = rest[length:]
            assert self.conn.transport is not None
            self.conn.transport.write(_ANSWER)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.ended.set()


class HeldProvider:
    def __init__(self, held: int = 1) -> None:
        self.held = held
        self.released = False
        #: the head of every request the server acted on, in order
        self.acted: list[str] = []
        self.conns: list[HeldConn] = []
        self._servers: list[_Server] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> HeldProvider:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Server(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def release(self) -> None:
        """The server reads its held connections again."""
        self.released = True
        for conn in self.conns:
            if conn.held and conn.transport is not None and not conn.transport.is_closing():
                conn.transport.resume_reading()
        for server in self._servers:
            if server.conn.held:
                server.act()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.abort()
                await conn.ended.wait()
        if self._server is not None:
            await self._server.wait_closed()
