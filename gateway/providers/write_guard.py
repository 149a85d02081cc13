"""The last check before bytes leave for an HTTP provider.

The effect path checks the attempt's deadline before it hands a request to
aiohttp, but between that check and the write there is request building,
a connection from the pool, a queued body-writer task: a process paused
there (SIGSTOP, a VM freeze, swap) would write after the database's drain
barrier has passed. So every provider connection's transport is wrapped: a
write under an attempt whose deadline has passed raises ``GateClosed``
instead of reaching the kernel. What is left between this check and the
``send()`` system call is a few instructions (docs/gateway.md, "the one
assumption").

The attempt reaches the wrapper through a context variable, which aiohttp's
body-writer task inherits from the request's task.

A provider connection is never closed gracefully: ``close()`` on the wrapper
is an abort, so nothing asyncio still buffers is written after the attempt
ended, and with the socket's ``SO_LINGER`` 0 (sockets.py) the kernel drops
its queue too and resets. And once an attempt's deadline comes while it is
still under way, the gate aborts every connection it let write, at once,
without waiting for the attempt's cancellation to reach the connection.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Iterable
from typing import Any

from gateway.effects.deadline import Deadline

#: a large body goes to aiohttp in pieces of this size, so that it is not
#: handed to asyncio at once: each piece passes the gate (the deadline) on its
#: own, and aiohttp waits for the transport to drain between them
CHUNK_BYTES = 16 * 1024


async def pieces(body: bytes, writes: WriteGate) -> AsyncIterator[bytes]:
    """``body`` in ``CHUNK_BYTES`` pieces (an upload aiohttp writes one by one);
    ``writes`` learns when the last one is handed over. aiohttp writes a piece
    in the step it takes it (no await between the two), so from then on the
    whole body has passed the gate (or a write of it was refused, which the
    gate counts): not when aiohttp asks for more, which it does only once
    that write has drained, by which time the kernel may have sent it all."""
    writes.body_done = False
    view = memoryview(body)
    for i in range(0, len(body), CHUNK_BYTES):
        if i + CHUNK_BYTES >= len(body):
            writes.body_done = True
        yield bytes(view[i:i + CHUNK_BYTES])


class GateClosed(Exception):
    """A write was refused: the attempt's deadline had passed."""


class WriteGate:
    """One attempt's permission to write, and what it wrote."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.written = 0
        self.closed = False
        #: a write of this attempt was refused: those bytes never left the process
        self.refused = False
        #: False while a body in pieces (``pieces``) has some not yet handed over
        self.body_done = True
        self._transports: list[GatedTransport] = []
        self._timer = asyncio.get_running_loop().call_later(
            max(0.0, deadline.remaining()), self._expire)

    def admit(self, size: int, transport: GatedTransport | None = None) -> None:
        if self.closed or self.deadline.remaining() <= 0:
            self.closed = True
            self.refused = True
            raise GateClosed("the attempt's deadline passed before this write")
        if transport is not None and transport not in self._transports:
            self._transports.append(transport)
        self.written += size

    def _expire(self) -> None:
        """The deadline came with the attempt still under way: whatever it
        wrote and the kernel has not sent is dropped, its connections reset."""
        self.closed = True
        for transport in self._transports:
            transport.abort()

    def never_whole(self) -> bool:
        """Whether this attempt's request certainly never left this host
        whole: a write was refused, a body's pieces were not all written, or a
        connection was reset with bytes still in asyncio's buffer (dropped
        before the kernel had them). Asked once the attempt ended without an
        answer; what the kernel had may have reached the provider, so False
        is "it may have", never "it did"."""
        return self.refused or not self.body_done or any(
            t.dropped for t in self._transports)

    def end(self) -> None:
        """The attempt is over (answered, or given up): its connections are
        its provider's again."""
        self._timer.cancel()
        self._transports.clear()


CURRENT: contextvars.ContextVar[WriteGate | None] = contextvars.ContextVar(
    "fencegate_write_gate", default=None)


class GatedTransport:
    """A transport whose writes pass the current attempt's gate first."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        #: bytes asyncio still held, not yet handed to the kernel, when this
        #: connection was reset: they never left this host
        self.dropped = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        gate = CURRENT.get()
        if gate is not None:
            gate.admit(len(data), self)
        self._transport.write(data)  # type: ignore[attr-defined]

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        chunks = list(chunks)
        gate = CURRENT.get()
        if gate is not None:
            gate.admit(sum(len(c) for c in chunks), self)
        self._transport.writelines(chunks)  # type: ignore[attr-defined]

    def abort(self) -> None:
        """Reset the connection, counting what asyncio drops with it."""
        if not self._transport.is_closing():
            try:
                self.dropped += self._transport.get_write_buffer_size()  # type: ignore[attr-defined]
            except (AttributeError, RuntimeError):  # a transport that cannot say
                pass
        self._transport.abort()  # type: ignore[attr-defined]

    def close(self) -> None:
        """An abort: a provider connection is never closed gracefully."""
        self.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
