"""A fault proxy that loses one particular answer: the first reply from the
server that carries ``marker`` (a value only the answer to the statement under
test holds: a resource name, a job's payload) is dropped, and that connection
is cut, as a network would cut it after the server committed. Everything else
passes."""

from __future__ import annotations

import asyncio

from tests.support.faultproxy import FaultProxy


class CutProxy(FaultProxy):
    """``CutProxy(dsn, marker=b"...")``: the first reply carrying ``marker``
    never arrives; its connection is reset. ``cut`` is set once that happened."""

    def __init__(self, upstream_dsn: str, *, marker: bytes) -> None:
        super().__init__(upstream_dsn)
        self.marker = marker
        self.cut = asyncio.Event()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    reply: bool) -> None:
        if not reply:
            await super()._pipe(src, dst, reply)
            return
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if not self.cut.is_set() and self.marker in data:
                    self.cut.set()  # the server has committed and answered: lose it
                    break
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.transport.abort()
            self._writers.discard(dst)
