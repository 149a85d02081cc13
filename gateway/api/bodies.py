"""Reading a whole body, request or answer, up to a limit.

``StreamReader.read(n)`` answers what is buffered, at most ``n`` bytes, not
``n`` bytes: a chunked upload, or an answer that arrives in pieces, would be
cut at its first piece. Everything here reads until the end or the limit.
"""

from __future__ import annotations

import asyncio

from aiohttp import StreamReader, web

from gateway.api.problems import Problem


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


async def receive(request: web.Request, limit: int, timeout: float) -> bytes:
    """The request's whole body, within ``limit`` bytes and ``timeout``
    seconds: 413 ``payload_too_large`` (a declared length over the limit
    before anything is read), 408 ``request_timeout``. Never more than
    ``limit + 1`` bytes are held."""
    if request.content_length is not None and request.content_length > limit:
        raise Problem("payload_too_large", f"the body is over the limit of {limit} bytes")
    try:
        async with asyncio.timeout(timeout):
            body = await read_limited(request.content, limit)
    except TimeoutError:
        raise Problem("request_timeout", f"the body did not arrive within {timeout:g} "
                      "seconds") from None
    if len(body) > limit:
        raise Problem("payload_too_large", f"the body is over the limit of {limit} bytes")
    return body
