"""Every metric label the gateway takes from a request is one of a known set
(issue 22, item 11).

With aiohttp's pure-Python parser (``AIOHTTP_NO_EXTENSIONS=1``, or a
platform without the C build) any token is a method, and the request
duration's ``method`` label was ``request.method``: each made-up method a
new series on the unauthenticated ``/metrics``. Methods outside the known
set are counted as ``other``.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import aiohttp

from tests.support.served import serve_gateway

#: the methods HTTP defines that the gateway serves or answers 405
KNOWN_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


async def _serve_pure_python(tmp_path: Path, dsn: str) -> tuple[subprocess.Popen[bytes], int]:
    proc, url = await serve_gateway(tmp_path, dsn, """
[providers.hook]
kind = "http"
base_url = "http://127.0.0.1:9/hook"
""", env={"AIOHTTP_NO_EXTENSIONS": "1"})
    return proc, int(url.rsplit(":", 1)[1])


async def _send(port: int, method: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"{method} /v1/leases/run:1 HTTP/1.1\r\nHost: gw\r\n"
                     "Connection: close\r\n\r\n".encode())
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()


async def test_made_up_methods_make_no_series(dsn: str, tmp_path: Path) -> None:
    proc, port = await _serve_pure_python(tmp_path, dsn)
    try:
        answers = [await _send(port, f"FAKE{i}") for i in range(50)]
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{port}/metrics") as r:
            text = await r.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    # the pure-Python parser let them through to the application
    assert all(a.startswith(b"HTTP/1.1 40") for a in answers), answers[0][:80]
    methods = set()
    for line in text.splitlines():
        if line.startswith("fencegate_http_request_duration_seconds_count{"):
            labels = line.split("{", 1)[1].split("}", 1)[0]
            methods.update(p.split("=", 1)[1].strip('"') for p in labels.split(",")
                           if p.startswith("method="))
    assert methods, text[:2000]
    assert methods <= {*KNOWN_METHODS, "other"}, sorted(methods)
    assert "other" in methods
