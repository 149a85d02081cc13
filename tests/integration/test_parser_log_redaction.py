"""What aiohttp's own request parser logs never carries a caller's API key
(issue 22, item 10).

A header line the parser refuses (``Authorization: Bearer <key>\\x7f``) is
answered 400 by aiohttp before any route runs, and ``aiohttp.server`` logs
the refusal at ERROR with the offending line: the key in the log. The
gateway's filter on that logger keeps the refusal's kind and drops what the
caller sent.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import API_KEY, Gw


async def _raw(gw: Gw, request: bytes) -> bytes:
    url = urlsplit(gw.url)
    assert url.hostname is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(request)
        await writer.drain()
        return await reader.read()  # aiohttp closes after a parser's refusal
    finally:
        writer.close()


@pytest.mark.parametrize("line", [
    f"Authorization: Bearer {API_KEY}\x7f",
    f"Authorization: Bearer {API_KEY}\x01",
    f"X-Note\x7f: {API_KEY}",
])
async def test_a_refused_header_line_never_logs_the_key(
        gw: Gw, caplog: pytest.LogCaptureFixture, line: str) -> None:
    caplog.set_level(logging.DEBUG)
    answer = await _raw(gw, (f"GET /v1/leases/run:1 HTTP/1.1\r\nHost: gw\r\n{line}\r\n"
                             "\r\n").encode("latin-1"))
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:80]
    logged = caplog.text + "".join(
        repr(r.args) + str(r.exc_info) + (r.exc_text or "") for r in caplog.records)
    assert API_KEY not in logged
    assert API_KEY.encode().hex() not in logged
    assert any(r.name == "aiohttp.server" for r in caplog.records), "nothing was logged"
