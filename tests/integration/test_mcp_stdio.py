"""``fencegate mcp`` over stdio, driven by the MCP SDK's own client against a
real gateway process, SMTP sink and webhook sink (issue 27): the tools are
listed with their schemas and honest annotations; an effect tool needs a
claimed run; a repeated identical call is replayed, never sent twice; bad
input is a tool error and the session goes on; and the zombie: the server
process stopped past its ttl while another worker takes the run over is
refused on its next email when it continues, and nothing reaches the sink."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from tests.support.agents import Stack, call, gateway_stack, mcp_children, stdio_params
from tests.support.waiting import until

LOST = ("stale_fence", "lease_expired")


@pytest.fixture
async def stack(tmp_path: Path, dsn: str) -> AsyncIterator[Stack]:
    async with gateway_stack(tmp_path, dsn) as s:
        yield s


async def test_the_tools_are_listed_with_schemas_and_honest_annotations(stack: Stack) -> None:
    async with Client(stdio_params(stack)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"claim_run", "send_email", "http_request", "release_run",
                          "run_status"}
    assert tools["claim_run"].input_schema["required"] == ["resource"]
    assert set(tools["send_email"].input_schema["properties"]) >= {
        "from", "to", "cc", "bcc", "reply_to", "subject", "text", "html", "provider",
        "idempotency_key"}
    assert tools["http_request"].input_schema["required"] == ["provider", "method", "path"]
    hints = {n: (t.annotations.read_only_hint, t.annotations.destructive_hint,
                 t.annotations.idempotent_hint)
             for n, t in tools.items() if t.annotations is not None}
    assert hints == {"claim_run": (False, False, True), "send_email": (False, True, True),
                     "http_request": (False, True, True), "release_run": (False, False, True),
                     "run_status": (True, False, True)}


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28, or the handshake
async def test_a_repeated_identical_email_is_replayed_and_lands_once(
        stack: Stack, mode: str) -> None:
    email = {"to": ["lead@example.com"], "subject": "Hello", "text": "Glad to meet you."}
    async with Client(stdio_params(stack), mode=mode) as client:
        error, text, _ = await call(client, "send_email", **email)
        assert error and text.startswith("no_run") and "claim_run" in text
        assert not stack.smtp.deliveries

        error, text, run = await call(client, "claim_run", resource="run:mail-1")
        assert not error, text
        assert run["held"] and run["fence"] > 0
        assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")

        error, text, first = await call(client, "send_email", **email)
        assert not error, text
        assert first["status"] == "sent" and first["fence"] == run["fence"]
        assert not first["replayed"]
        error, text, again = await call(client, "send_email", **email)
        assert not error, text
        assert again["replayed"] and again["message_id"] == first["message_id"]
        assert len(stack.smtp.deliveries) == 1

        error, text, other = await call(client, "send_email", **email,
                                        idempotency_key="second-hello")
        assert not error and not other["replayed"], text
        assert len(stack.smtp.deliveries) == 2

        error, text, hooked = await call(client, "http_request", provider="hook",
                                         method="POST", path="notes", json={"a": 1})
        assert not error and hooked["status"] == 200, text
        await call(client, "http_request", provider="hook", method="POST", path="notes",
                   json={"a": 1})
        assert len(stack.hook.deliveries) == 1
        assert stack.hook.deliveries[0].header("Fence-Token") == str(run["fence"])


async def test_bad_input_is_a_tool_error_and_the_session_goes_on(stack: Stack) -> None:
    async with Client(stdio_params(stack)) as client:
        error, text, _ = await call(client, "claim_run", resource="run:bad", ttl_seconds="x")
        assert error and text.startswith("bad_request") and "ttl_seconds" in text
        error, text, _ = await call(client, "claim_run", resource="not a resource!")
        assert error and text.startswith("bad_request")
        assert not (await call(client, "claim_run", resource="run:bad"))[0]
        for args in ({"to": "lead@example.com", "subject": "x"},         # not a list
                     {"to": ["lead@example.com"]},                        # no subject
                     {"to": ["lead@example.com"], "subject": "x", "bcc_all": True}):
            error, text, _ = await call(client, "send_email", **args)
            assert error and text.startswith("bad_request"), (args, text)
        error, text, _ = await call(client, "send_email", to=["not-an-address"], subject="x")
        assert error and text.startswith("bad_request"), text   # the gateway's 400
        error, text, _ = await call(client, "no_such_tool")
        assert error and text.startswith("bad_request")
        error, text, status = await call(client, "run_status")
        assert not error and status["held"], text
        error, text, _ = await call(client, "send_email", to=["lead@example.com"],
                                    subject="still fine", text="ok")
        assert not error, text
    assert len(stack.smtp.deliveries) == 1


async def test_the_stalled_server_is_refused_after_another_worker_took_the_run(
        stack: Stack) -> None:
    """The zombie: the server process is stopped (SIGSTOP: a GC pause, a closed
    lid) until another worker has claimed the run through the lease API, then
    continued. Its next email answers isError with the reason first, and
    nothing reaches the sink from it."""
    async with Client(stdio_params(stack)) as client:
        error, text, run = await call(client, "claim_run", resource="run:zombie",
                                      ttl_seconds=1.5)
        assert not error, text
        [server] = mcp_children()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            await until(lambda: server.status() == "stopped", "the server is stopped")
            fence = await stack.take_over("run:zombie")
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert fence > run["fence"]

        error, text, answer = await call(client, "send_email", to=["lead@example.com"],
                                         subject="Late", text="I am a zombie.")
        assert error, text
        assert text.startswith(LOST) and "Stop" in text, text
        assert answer["error"] in LOST
        error, text, status = await call(client, "run_status")
        assert not error and not status["held"] and status["reason"] in LOST
        error, text, _ = await call(client, "http_request", provider="hook", method="POST",
                                    path="late")
        assert error and text.startswith(LOST)
    assert not stack.smtp.deliveries and not stack.hook.deliveries
