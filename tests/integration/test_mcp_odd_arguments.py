"""Red-team findings on ``fencegate mcp``'s tools as a library: what a
program (or a framework's JSON) can hand a tool must be an error answer,
never an exception out of ``RunTools.call`` / ``FunctionTool.run`` (the
module's promise: "never raises for what a model can cause")."""

from __future__ import annotations

from typing import Any

from gateway.mcp import RunTools
from gateway.mcp.adapter import function_tools
from tests.integration.conftest import API_KEY, Gw


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def test_a_body_nested_too_deep_is_a_bad_request_and_sends_nothing(gw: Gw) -> None:
    async with RunTools(gw.url, API_KEY) as run:
        claimed = await run.call("claim_run", {"resource": "lead:deep"})
        assert not claimed.is_error, claimed.text
        answer = await run.call("http_request", {"provider": "hook", "method": "POST",
                                                 "path": "x", "json": _nested(100_000)})
        assert answer.is_error and answer.text.startswith("bad_request"), answer.text
        assert gw.hook.deliveries == []
        status = await run.call("run_status", {})
        assert status.data["held"]


async def test_a_body_json_cannot_encode_is_a_bad_request(gw: Gw) -> None:
    async with RunTools(gw.url, API_KEY) as run:
        await run.call("claim_run", {"resource": "lead:odd"})
        for odd in ({"tags": {"a", "b"}}, {"blob": b"\x00"}, {"when": object()},
                    {1: "a", "b": 2}, {"n": float("nan")}):
            answer = await run.call("http_request", {"provider": "hook", "method": "POST",
                                                     "path": "x", "json": odd})
            assert answer.is_error and answer.text.startswith("bad_request"), answer.text
        assert gw.hook.deliveries == []


async def test_adapter_json_text_nested_too_deep_is_a_bad_request(gw: Gw) -> None:
    async with RunTools(gw.url, API_KEY) as run:
        send = {t.name: t for t in function_tools(run)}["http_request"]
        answer = await send.run("[" * 100_000 + "]" * 100_000)
        assert answer.is_error and answer.text.startswith("bad_request"), answer.text
