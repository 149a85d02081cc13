"""A PostgreSQL wire proxy that counts the gateway's round trips by statement
and can hold back every answer of the server (section 5 of bench/run.py).

The gateway is pointed at it (its DSN names the proxy); the proxy passes
every byte on, reading the client's side of the protocol as it goes: a Parse
names a statement's text, a Bind says which statement is about to run, and a
Sync (or a simple Query) ends one round trip, which in autocommit is one
transaction. Each round trip is counted under the class of the statement it
ran: ``admission`` (fencegate_admit_effect / _effects), ``outcome``
(fencegate_finish_effect / _effects), ``prepare`` (a Parse with nothing run:
asyncpg preparing a statement), ``other``.

``delay`` (seconds, changeable at any time) holds back everything the server
sends by that long, in order: every round trip then takes ``delay`` longer,
and a caller who waits for k of them waits ``k * delay`` longer. That is how
the statements awaited *before the answer* are measured from outside, without
reading the gateway's code or its timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: the untyped requests a client may send before its startup message
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104

CLASSES = ("admission", "outcome", "prepare", "other")
_ADMISSION = re.compile(r"\bfencegate_admit_effects?\(")
_OUTCOME = re.compile(r"\bfencegate_finish_effects?\(")


def classify(query: str | None) -> str:
    if query is None:
        return "prepare"
    if _ADMISSION.search(query):
        return "admission"
    if _OUTCOME.search(query):
        return "outcome"
    return "other"


def _cstring(body: bytes, at: int) -> tuple[str, int]:
    end = body.index(b"\0", at)
    return body[at:end].decode(errors="replace"), end + 1


class WireProxy:
    """Listens on 127.0.0.1; ``dsn_via(dsn)`` is ``dsn`` pointed at it."""

    def __init__(self, upstream_dsn: str) -> None:
        parts = urlsplit(upstream_dsn)
        query = dict(parse_qsl(parts.query))
        host = query.get("host") or parts.hostname or "localhost"
        port = int(query.get("port") or parts.port or 5432)
        self._unix = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self._tcp = (host, port)
        self.delay = 0.0
        self.round_trips: dict[str, int] = dict.fromkeys(CLASSES, 0)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> WireProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def dsn_via(self, dsn: str) -> str:
        parts = urlsplit(dsn)
        userinfo = parts.netloc.rpartition("@")[0]
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port")]
        netloc = (userinfo + "@" if userinfo else "") + f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))

    def snapshot(self) -> dict[str, int]:
        """The counts so far (safe to call from another thread: the keys are fixed)."""
        return dict(self.round_trips)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._unix is not None:
            return await asyncio.open_unix_connection(self._unix)
        return await asyncio.open_connection(*self._tcp)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_reader = up_writer = None
        try:
            up_reader, up_writer = await self._connect()
            if not await self._startup(reader, writer, up_writer):
                return
            await asyncio.gather(self._from_client(reader, up_writer),
                                 self._from_server(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # close(): this session ends here, quietly
            pass
        finally:
            self._tasks.discard(task)
            for w in (writer, up_writer):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()

    async def _startup(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       up: asyncio.StreamWriter) -> bool:
        """The untyped start of a session: encryption is declined here (the
        proxy must read the protocol), the startup message passed on."""
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                writer.write(b"N")
                await writer.drain()
                continue
            up.write(head + await reader.readexactly(length - 8))
            await up.drain()
            return True

    async def _from_client(self, reader: asyncio.StreamReader,
                           up: asyncio.StreamWriter) -> None:
        statements: dict[str, str] = {}
        bound: str | None = None
        while True:
            head = await reader.readexactly(5)
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = await reader.readexactly(length - 4)
            if kind == b"P":  # Parse: statement name, text
                name, at = _cstring(body, 0)
                statements[name], _ = _cstring(body, at)
            elif kind == b"B":  # Bind: portal, statement
                _, at = _cstring(body, 0)
                name, _ = _cstring(body, at)
                bound = statements.get(name, "")
            elif kind == b"S":  # Sync: the end of one round trip
                self.round_trips[classify(bound)] += 1
                bound = None
            elif kind == b"Q":  # a simple query: a round trip of its own
                self.round_trips[classify(_cstring(body, 0)[0])] += 1
            up.write(head + body)
            if kind in (b"S", b"Q", b"X", b"H"):  # the client now waits: send it
                await up.drain()
            if kind == b"X":
                return

    async def _from_server(self, up: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, data = await held.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        releaser = loop.create_task(release())
        try:
            while data := await up.read(65536):
                held.put_nowait((loop.time() + self.delay, data))
            while not held.empty():
                await asyncio.sleep(0.001)
        finally:
            releaser.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await releaser
