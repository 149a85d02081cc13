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
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterable
from typing import Any

from ..deadline import Deadline


class GateClosed(Exception):
    """A write was refused: the attempt's deadline had passed."""


class WriteGate:
    """One attempt's permission to write, and what it wrote."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.written = 0
        self.closed = False

    def admit(self, size: int) -> None:
        if self.closed or self.deadline.remaining() <= 0:
            self.closed = True
            raise GateClosed("the attempt's deadline passed before this write")
        self.written += size


CURRENT: contextvars.ContextVar[WriteGate | None] = contextvars.ContextVar(
    "fencegate_write_gate", default=None)


class GatedTransport:
    """A transport whose writes pass the current attempt's gate first."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        gate = CURRENT.get()
        if gate is not None:
            gate.admit(len(data))
        self._transport.write(data)  # type: ignore[attr-defined]

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        chunks = list(chunks)
        gate = CURRENT.get()
        if gate is not None:
            gate.admit(sum(len(c) for c in chunks))
        self._transport.writelines(chunks)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
