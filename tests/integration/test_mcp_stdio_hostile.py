"""Red team of ``fencegate mcp`` over stdio against a real gateway: a call
written while the server is stopped past its ttl (it is read the moment the
process continues, racing the renewal timer) sends nothing; garbage on stdin
does not end the session, stdout carries nothing but JSON-RPC, and the API
key appears nowhere in the output."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.integration.conftest import API_KEY
from tests.support.agents import Stack, call, gateway_stack, mcp_children, stdio_params
from tests.support.waiting import until

LOST = ("stale_fence", "lease_expired")


@pytest.fixture
async def stack(tmp_path: Path, dsn: str) -> AsyncIterator[Stack]:
    async with gateway_stack(tmp_path, dsn) as s:
        yield s


async def test_a_call_queued_while_stopped_past_the_ttl_sends_nothing(stack: Stack) -> None:
    async with Client(stdio_params(stack)) as client:
        error, text, run = await call(client, "claim_run", resource="run:queued",
                                      ttl_seconds=1.5)
        assert not error, text
        [server] = mcp_children()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            await until(lambda: server.status() == "stopped", "the server is stopped")
            fence = await stack.take_over("run:queued")
            # written into the pipe while stopped: the first thing it reads
            late = asyncio.ensure_future(call(client, "send_email", to=["lead@example.com"],
                                              subject="Late", text="queued zombie"))
            hook = asyncio.ensure_future(call(client, "http_request", provider="hook",
                                              method="POST", path="late"))
            await asyncio.sleep(0)  # let both requests be written
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert fence > run["fence"]
        for error, text, _ in await asyncio.gather(late, hook):
            assert error and text.startswith(LOST), text
    assert not stack.smtp.deliveries and not stack.hook.deliveries


def _rpc(id_: int, method: str, params: dict[str, Any] | None = None) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode() + b"\n"


INIT = {"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "redteam", "version": "1"}}


def _stdio(stack: Stack, lines: list[bytes], want: set[int]) -> tuple[list[bytes], bytes]:
    """Write ``lines`` to a fresh ``fencegate mcp`` and read its stdout until
    every id in ``want`` is answered (or stdout ends); (stdout lines, stderr)."""
    params = stdio_params(stack)
    proc = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **stack.env()})
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"".join(lines))
    proc.stdin.flush()
    out: list[bytes] = []
    answered: set[int] = set()
    try:
        while not want <= answered:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            try:
                answered.add(json.loads(line).get("id"))
            except ValueError:
                pass
    finally:
        proc.stdin.close()
        rest = proc.stdout.read()
        proc.wait(30)
    out += rest.splitlines(keepends=True)
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    return out, err


async def test_garbage_on_stdin_leaves_the_session_and_stdout_pure(stack: Stack) -> None:
    lines = [b"garbage, not json\n", b"\xff\xfe\x00binary\n", b'{"jsonrpc":"2.0"}\n',
             b"[1,2,3]\n", b"{}\n", b'{"jsonrpc":"2.0","id":99,"method":"no/such"}\n',
             _rpc(1, "initialize", INIT),
             b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n',
             b"more garbage\n" * 50,
             _rpc(2, "tools/call", {"name": "claim_run", "arguments": {"resource": "run:g"}}),
             _rpc(3, "tools/call", {"name": "send_email", "arguments": {"to": "x"}}),
             _rpc(4, "tools/call", {"name": "nope", "arguments": []}),
             _rpc(5, "tools/call", {"name": "run_status", "arguments": {}})]
    out, err = await asyncio.to_thread(_stdio, stack, lines, {1, 2, 3, 4, 5})
    docs = [json.loads(line) for line in out]  # every stdout line is JSON
    assert all(d.get("jsonrpc") == "2.0" for d in docs), out
    by_id = {d.get("id"): d for d in docs}
    assert {1, 2, 3, 4, 5} <= set(by_id), out
    # calls run concurrently: run_status may answer before the claim
    assert by_id[2]["result"]["structuredContent"]["held"], by_id[2]
    assert not by_id[5]["result"]["isError"], by_id[5]
    assert by_id[3]["result"]["isError"]  # bad arguments: a tool error
    assert "error" in by_id[4] or by_id[4]["result"]["isError"]  # SDK refuses [] args
    assert API_KEY.encode() not in err and not any(API_KEY.encode() in o for o in out)
