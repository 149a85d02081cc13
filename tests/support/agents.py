"""What the tests of ``fencegate mcp`` share: a real gateway process in front
of an SMTP sink and a webhook sink, ``fencegate mcp`` itself as a process
(stdio, or streamable HTTP on a free port), and the lease API of "another
worker" that takes the run over."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from mcp import Client, StdioServerParameters

from tests.support.served import API_KEY, FENCEGATE, free_port, serve_gateway
from tests.support.sinks import SmtpSink, WebhookSink
from tests.support.waiting import GENEROUS_SECONDS, until

SENDER = "agent@example.com"


@dataclass
class Stack:
    """A gateway (``url``) with its providers ``mail`` (``smtp``) and
    ``hook`` (``hook``)."""

    url: str
    smtp: SmtpSink
    hook: WebhookSink
    tmp_path: Path

    def env(self) -> dict[str, str]:
        """What ``fencegate mcp`` needs in its environment."""
        return {"FENCEGATE_API_KEY": API_KEY, "PYTHONPATH": os.getcwd()}

    async def take_over(self, resource: str, owner: str = "other-worker") -> int:
        """Claim ``resource`` through the lease API as another worker, polling
        until its holder's lease has expired; the fence won."""
        async with aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            won: list[int] = []

            async def claimed() -> bool:
                async with http.post(self.url + "/v1/leases/claim", json={
                        "resource": resource, "owner": owner, "ttl_seconds": 60}) as r:
                    if r.status == 200:
                        won.append((await r.json())["fence"])
                    return bool(won)

            await until(claimed, f"another worker claims {resource}", every=0.05)
            return won[0]


@contextlib.asynccontextmanager
async def gateway_stack(tmp_path: Path, dsn: str) -> AsyncIterator[Stack]:
    smtp = await SmtpSink().start()
    hook = await WebhookSink().start()
    proc, url = await serve_gateway(tmp_path, dsn, f"""
[providers.mail]
kind = "smtp"
host = "127.0.0.1"
port = {smtp.port}
tls = "none"
timeout_seconds = 10

[providers.hook]
kind = "http"
base_url = "http://127.0.0.1:{hook.port}/hook"
timeout_seconds = 10
idempotency_header = ""
""")
    try:
        yield Stack(url, smtp, hook, tmp_path)
    finally:
        proc.terminate()
        proc.wait()
        await hook.close()
        await smtp.close()


def stdio_params(stack: Stack) -> StdioServerParameters:
    """``fencegate mcp --gateway URL`` over stdio, as an MCP client spawns it."""
    return StdioServerParameters(command=FENCEGATE[0], args=[
        *FENCEGATE[1:], "mcp", "--gateway", stack.url, "--from", SENDER], env=stack.env())


def mcp_children() -> list[psutil.Process]:
    """The ``fencegate mcp`` processes this test process spawned."""
    return [p for p in psutil.Process().children(recursive=True)
            if "mcp" in p.cmdline() and "gateway.cli" in p.cmdline()]


@contextlib.asynccontextmanager
async def http_server(stack: Stack) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """``fencegate mcp --http 127.0.0.1:PORT`` as a process; its endpoint's
    URL once it answers."""
    port = free_port()
    log = stack.tmp_path / "mcp-http.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*FENCEGATE, "mcp", "--gateway", stack.url, "--from", SENDER,
             "--http", f"127.0.0.1:{port}"],
            env={**os.environ, **stack.env()}, stdout=subprocess.DEVNULL, stderr=sink)
    url = f"http://127.0.0.1:{port}/mcp"

    async def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    try:
        await until(up, "fencegate mcp --http listens")
        yield proc, url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a test that stopped it may have failed
            proc.terminate()
        proc.wait(timeout=GENEROUS_SECONDS)


async def call(client: Client, tool: str, **arguments: Any) -> tuple[bool, str, Any]:
    """One tool call: (is_error, its text, its structured content)."""
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)
    return result.is_error, text, result.structured_content

