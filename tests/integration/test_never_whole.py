"""What an attempt's write gate says of a request it cut: "never left whole"
(``WriteGate.never_whole``) lets an operator resolve it "not sent" as soon as
the attempt is over, without the held-request wait (issue 21), so it must
never be said of a request whose every byte the kernel took. Driven here on
a real connection, as aiohttp drives a body in pieces: it writes a piece in
the step it is given it, then waits for the transport to drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.effects.deadline import Deadline
from gateway.providers import write_guard
from leases import clock
from tests.support.waiting import until


class _Peer:
    """A provider's host that reads everything it is sent."""

    def __init__(self) -> None:
        self.received = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            self.received += len(data)
        writer.close()


@pytest.fixture
async def peer() -> AsyncIterator[_Peer]:
    p = _Peer()
    p.server = await asyncio.start_server(p._serve, "127.0.0.1", 0)
    yield p
    p.server.close()
    await p.server.wait_closed()


async def test_a_body_whose_last_piece_the_kernel_took_may_have_arrived_whole(
        peer: _Peer) -> None:
    """The last piece is written, the provider's host has every byte, and
    the attempt is reset before aiohttp comes back to the body for more (it
    waits for the transport to drain after a piece: the deadline may come
    first). The gate said "never whole" because the body had not been asked
    for again, and "not sent" could be resolved at once: a resend then acts
    a second time on a request the provider holds whole."""
    assert peer.server is not None
    port = peer.server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    gate = write_guard.WriteGate(Deadline(clock.now() + 30))
    wrapped = write_guard.GatedTransport(transport)
    body = b"y" * (write_guard.CHUNK_BYTES * 3)
    token = write_guard.CURRENT.set(gate)
    try:
        stream = write_guard.pieces(body, gate)
        for _ in range(3):  # as aiohttp's payload writer: a piece, then its write
            wrapped.write(await anext(stream))
        await until(lambda: peer.received == len(body), "the peer has the whole body")
        assert transport.get_write_buffer_size() == 0
        wrapped.abort()  # the attempt's deadline: reset, aiohttp not yet back for more
    finally:
        write_guard.CURRENT.reset(token)
        gate.end()
    assert not gate.never_whole(), "a request the provider holds whole was called never whole"
