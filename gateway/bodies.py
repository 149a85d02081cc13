"""Reading a whole body, request or answer, up to a limit.

``StreamReader.read(n)`` answers what is buffered, at most ``n`` bytes, not
``n`` bytes: a chunked upload, or an answer that arrives in pieces, would be
cut at its first piece. Everything here reads until the end or the limit.
"""

from __future__ import annotations

from aiohttp import StreamReader


async def read_limited(stream: StreamReader, limit: int) -> bytes:
    """The whole body, or its first ``limit + 1`` bytes if it is longer (so
    the caller can tell "over the limit" from "exactly the limit")."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await stream.read(limit + 1 - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)
