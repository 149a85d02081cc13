"""``fencegate mcp --http`` (streamable HTTP), driven by the MCP SDK's own
client against a real gateway (issue 27): each MCP session is its own run;
a repeated identical call is replayed; bad input is a tool error in a
session that goes on; a session's end releases its run; the zombie (the
server process stopped past the ttl while another worker takes the run over)
is refused on its next email and nothing reaches the sink."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psutil
import pytest
from mcp import Client

from tests.support.agents import Stack, call, gateway_stack, http_server
from tests.support.served import API_KEY
from tests.support.waiting import until

LOST = ("stale_fence", "lease_expired")
EMAIL = {"to": ["lead@example.com"], "subject": "Hello", "text": "Glad to meet you."}


@pytest.fixture
async def stack(tmp_path: Path, dsn: str) -> AsyncIterator[Stack]:
    async with gateway_stack(tmp_path, dsn) as s:
        yield s


@pytest.fixture
async def served(stack: Stack) -> AsyncIterator[tuple[int, str]]:
    async with http_server(stack) as (proc, url):
        yield proc.pid, url


async def _live(stack: Stack, resource: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(
            f"{stack.url}/v1/leases/{resource}",
            headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        return bool((await r.json())["live"])


async def test_each_session_is_its_own_run(stack: Stack, served: tuple[int, str]) -> None:
    _, url = served
    async with Client(url) as a, Client(url) as b:
        tools = {t.name for t in (await a.list_tools()).tools}
        assert "send_email" in tools
        error, text, run_a = await call(a, "claim_run", resource="run:http-a")
        assert not error, text
        error, text, _ = await call(b, "send_email", **EMAIL)
        assert error and text.startswith("no_run"), text     # b has no run of its own
        error, text, _ = await call(b, "claim_run", resource="run:http-a")
        assert error and text.startswith("lease_held"), text  # a holds it
        error, text, run_b = await call(b, "claim_run", resource="run:http-b")
        assert not error, text

        for client, fence in ((a, run_a["fence"]), (b, run_b["fence"])):
            error, text, sent = await call(client, "send_email", **EMAIL)
            assert not error and sent["fence"] == fence and not sent["replayed"], text
            error, text, again = await call(client, "send_email", **EMAIL)
            assert not error and again["replayed"], text
        assert len(stack.smtp.deliveries) == 2   # one per run: the keys are per run

        error, text, _ = await call(a, "send_email", to="lead@example.com", subject="x")
        assert error and text.startswith("bad_request"), text
        error, text, status = await call(a, "run_status")
        assert not error and status["held"] and status["resource"] == "run:http-a"
    for resource in ("run:http-a", "run:http-b"):
        async def released(r: str = resource) -> bool:
            return not await _live(stack, r)
        await until(released, f"the end of its session releases {resource}")


async def test_a_client_without_a_session_is_told_so(served: tuple[int, str]) -> None:
    _, url = served
    async with Client(url, mode="2026-07-28") as client:
        error, text, _ = await call(client, "claim_run", resource="run:sessionless")
    assert error and text.startswith("session_required"), text


async def test_the_stalled_server_is_refused_after_another_worker_took_the_run(
        stack: Stack, served: tuple[int, str]) -> None:
    pid, url = served
    server = psutil.Process(pid)
    async with Client(url) as client:
        error, text, run = await call(client, "claim_run", resource="run:http-zombie",
                                      ttl_seconds=1.5)
        assert not error, text
        os.kill(pid, signal.SIGSTOP)
        try:
            await until(lambda: server.status() == "stopped", "the server is stopped")
            fence = await stack.take_over("run:http-zombie")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert fence > run["fence"]
        error, text, _ = await call(client, "send_email", **EMAIL)
        assert error and text.startswith(LOST) and "Stop" in text, text
        error, text, status = await call(client, "run_status")
        assert not error and not status["held"], text
    assert not stack.smtp.deliveries
