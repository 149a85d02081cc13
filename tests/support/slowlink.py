"""A slow network link on loopback, between the gateway and a provider.

``SlowLink(upstream_port, rate=...)`` listens on 127.0.0.1 and forwards each
connection to the provider at ``upstream_port``. What the gateway sends is
read in small reads, at most ``rate`` bytes a second, through a small receive
buffer, and forwarded as it is read: the gateway's kernel holds the rest, as
it would in front of a slow path or a provider that reads slowly. Answers
come back at full speed.

Like a real link, it carries only what already left the gateway's host: when
the gateway's side is reset (an abort, ``SO_LINGER`` 0, a killed process),
the link stops and cuts the provider's side; whatever the gateway's kernel
still held never arrives. A graceful close (FIN) is forwarded only after
everything before it, as TCP delivers it.

``slow_connections`` limits the throttle to the first N connections (later
ones, a repeat on a fresh connection, pass at full speed). ``set_rate``
changes the throttle of every slow connection at once: ``None`` passes at
full speed, 0 stops reading (a provider that stops reading its socket). Each
connection's fate is a ``Conn``: how many bytes it forwarded, and how it
ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field

#: the link's own receive buffer: what the provider's host may already hold
RECEIVE_BUFFER = 4096
READ_SIZE = 1024


@dataclass
class Conn:
    """One connection through the link."""

    slow: bool
    forwarded: int = 0
    #: a stall of this connection alone (``SlowLink.stall``): its rate, and until when
    stalled_rate: float = 0.0
    stalled_until: float = 0.0
    #: "reset" (the gateway's side was reset) or "eof" (closed gracefully)
    ending: str | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: set once the provider's side is done (cut, or answered and closed)
    settled: asyncio.Event = field(default_factory=asyncio.Event)


class SlowLink:
    def __init__(self, upstream_port: int, *, rate: float | None,
                 slow_connections: int | None = None, port: int = 0) -> None:
        self.upstream_port = upstream_port
        self.rate = rate
        self.slow_connections = slow_connections
        self._moving = asyncio.Event()
        if rate != 0:
            self._moving.set()
        self.conns: list[Conn] = []
        self.port = port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> SlowLink:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # set before listen(): accepted sockets inherit it, and the window the
        # gateway sees is the link's, from the first segment on
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(16)
        sock.setblocking(False)
        self._server = await asyncio.start_server(self._accept, sock=sock)
        self.port = sock.getsockname()[1]
        return self

    def set_rate(self, rate: float | None) -> None:
        self.rate = rate
        if rate == 0:
            self._moving.clear()
        else:
            self._moving.set()

    def stall(self, seconds: float, rate: float) -> None:
        """Every connection open now carries at most ``rate`` bytes a second
        (0: nothing) for ``seconds``; connections opened later pass as the
        link's rate says. The path those flows took got slow, or the provider
        stopped reading them."""
        until = asyncio.get_running_loop().time() + seconds
        for conn in self.conns:
            if not conn.ended.is_set():
                conn.stalled_rate, conn.stalled_until = rate, until

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def all_ended(self) -> None:
        """Wait until every connection so far has ended on the gateway's side
        and the provider's side is settled."""
        for conn in list(self.conns):
            await conn.ended.wait()
            await conn.settled.wait()

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        slow = self.slow_connections is None or len(self.conns) < self.slow_connections
        conn = Conn(slow=slow)
        self.conns.append(conn)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1",
                                                                 self.upstream_port)
        except OSError:
            _cut(writer)
            conn.ending = "reset"
            conn.ended.set()
            conn.settled.set()
            return
        back = asyncio.create_task(self._answers(up_reader, writer))
        try:
            await self._requests(conn, reader, up_writer)
        finally:
            conn.ended.set()
            if conn.ending == "eof":
                # the provider got everything: let it answer and close
                with contextlib.suppress(BaseException):
                    await back
            else:
                _cut(up_writer)
                back.cancel()
                with contextlib.suppress(BaseException):
                    await back
            _cut(writer)
            _cut(up_writer)
            conn.settled.set()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _requests(self, conn: Conn, reader: asyncio.StreamReader,
                        up: asyncio.StreamWriter) -> None:
        while True:
            if conn.slow:
                await self._moving.wait()
            try:
                data = await reader.read(READ_SIZE)
            except OSError:
                conn.ending = "reset"
                return
            if not data:
                conn.ending = "eof"
                with contextlib.suppress(OSError):
                    up.write_eof()
                return
            up.write(data)
            conn.forwarded += len(data)
            with contextlib.suppress(OSError):
                await up.drain()
            await self._stalled(conn, len(data))
            if conn.slow:
                await self._moving.wait()
                if self.rate:
                    await asyncio.sleep(len(data) / self.rate)

    async def _stalled(self, conn: Conn, size: int) -> None:
        loop = asyncio.get_running_loop()
        while (left := conn.stalled_until - loop.time()) > 0:
            if conn.stalled_rate:
                await asyncio.sleep(min(left, size / conn.stalled_rate))
                return
            await asyncio.sleep(left)

    async def _answers(self, up: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await up.read(65536):
                writer.write(data)
                await writer.drain()


def _cut(writer: asyncio.StreamWriter) -> None:
    """Reset the connection (nothing more goes either way)."""
    writer.transport.abort()
    writer.close()
