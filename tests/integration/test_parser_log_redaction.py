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
import os
import subprocess
import sys
import textwrap
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


LINES = [
    f"Authorization: Bearer {API_KEY}\x7f",
    f"Authorization: Bearer {API_KEY}\x00",
    f"Authorization : Bearer {API_KEY}",
    f"X-Note\x7f: {API_KEY}",
    f"Authorization: Bearer {API_KEY}" + "a" * 9000,  # a line over the parser's limit
]


@pytest.mark.parametrize("line", LINES)
async def test_a_refused_header_line_never_reaches_the_answer(gw: Gw, line: str) -> None:
    """aiohttp answers a request its parser refuses with a 400 whose text is
    the exception's message, which quotes the offending line (the C parser
    with a caret under it, the pure-Python one the value): the key must not
    come back in the body, to the caller or to whatever logs answers on the
    way (a proxy, a load balancer)."""
    answer = await _raw(gw, (f"GET /v1/leases/run:1 HTTP/1.1\r\nHost: gw\r\n{line}\r\n"
                             "\r\n").encode("latin-1"))
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:80]
    assert API_KEY.encode() not in answer, answer


@pytest.mark.parametrize("line", LINES)
def test_a_refused_header_line_never_reaches_the_answer_of_the_pure_python_parser(
        dsn: str, line: str) -> None:
    """The same with aiohttp's pure-Python parser (``AIOHTTP_NO_EXTENSIONS=1``,
    a platform without the C build), in a process of its own: the choice is
    made at import."""
    script = textwrap.dedent(f"""
        import asyncio, os, sys
        from aiohttp.test_utils import TestServer
        from tests.integration.conftest import gateway_config
        from gateway.app import build_app

        async def main():
            config = gateway_config(1, 1)
            app = build_app(config, os.environ["FG_TEST_DSN"], migrate_on_start=False)
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write({line!r}.join([
                    "GET /v1/leases/run:1 HTTP/1.1\\r\\nHost: gw\\r\\n", "\\r\\n\\r\\n"
                ]).encode("latin-1"))
                await writer.drain()
                sys.stdout.buffer.write(await reader.read())
                writer.close()
            finally:
                await server.close()

        asyncio.run(main())
    """)
    env = {**os.environ, "FG_TEST_DSN": dsn, "AIOHTTP_NO_EXTENSIONS": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          timeout=60, check=True)
    answer = done.stdout
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:80]
    assert API_KEY.encode() not in answer, answer
