"""A TCP fault proxy for tests: forwards to PostgreSQL (TCP or unix socket) or
any TCP service and, on command, delays traffic, black-holes it (connections
stay open, bytes stop), drops every connection and refuses new ones, or loses
the answers: requests still reach the server (and commit), its replies never
come back (a connection cut after the commit, a pooler restart)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal
from urllib.parse import parse_qs, urlsplit, urlunsplit

Mode = Literal["pass", "delay", "blackhole", "drop", "lose_replies"]


class FaultProxy:
    """``FaultProxy(dsn)`` for PostgreSQL, ``FaultProxy(tcp=(host, port))`` for
    anything else."""

    def __init__(self, upstream_dsn: str = "postgresql://127.0.0.1:5432/x", *,
                 tcp: tuple[str, int] | None = None, delay_seconds: float = 0.2) -> None:
        self.delay_seconds = delay_seconds
        parts = urlsplit(upstream_dsn)
        socket_dir = parse_qs(parts.query).get("host", [None])[0]
        port = parts.port or 5432
        if tcp is not None:
            self._unix, self._tcp = None, tcp
        elif socket_dir and socket_dir.startswith("/"):
            self._unix: str | None = f"{socket_dir}/.s.PGSQL.{port}"
            self._tcp: tuple[str, int] | None = None
        else:
            self._unix = None
            self._tcp = (parts.hostname or "127.0.0.1", port)
        self._upstream = parts
        self.mode: Mode = "pass"
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        #: connections whose replies were lost: unusable afterwards
        self._desynced: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def dsn(self) -> str:
        """The upstream DSN, pointed at this proxy."""
        user = self._upstream.username or "postgres"
        auth = f"{user}:{self._upstream.password}@" if self._upstream.password else f"{user}@"
        return urlunsplit(("postgresql", f"{auth}127.0.0.1:{self.port}",
                           self._upstream.path, "", ""))

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode != "lose_replies":
            for w in list(self._desynced):  # a reply went missing: cut them, as a network would
                w.transport.abort()
            self._desynced.clear()
        if mode == "drop":
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "drop":
            writer.transport.abort()
            return
        try:
            if self._unix:
                up_r, up_w = await asyncio.open_unix_connection(self._unix)
            else:
                assert self._tcp is not None
                up_r, up_w = await asyncio.open_connection(*self._tcp)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_w))
        for src, dst, reply in ((reader, up_w, False), (up_r, writer, True)):
            task = asyncio.get_running_loop().create_task(self._pipe(src, dst, reply))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    reply: bool) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if reply and self.mode == "lose_replies":
                    self._desynced.add(dst)
                    continue
                while self.mode == "blackhole":
                    await asyncio.sleep(0.01)  # hold the bytes: nothing gets through
                if self.mode == "delay":
                    await asyncio.sleep(self.delay_seconds)
                if self.mode == "drop":
                    break
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.transport.abort()
            self._writers.discard(dst)
