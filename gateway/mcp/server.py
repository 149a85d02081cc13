"""The MCP server of ``fencegate mcp``, on the SDK's low-level ``Server``: the
tools of ``gateway.mcp.specs`` listed with their schemas and annotations, and
each call answered by the session's ``RunTools``.

Where a session's run lives:

- **stdio**: the process is the session (one client, one pipe), so one
  ``RunTools`` for the process, made in the server's lifespan and released
  when the pipe closes. Both protocol eras work.
- **streamable HTTP**: one ``RunTools`` per MCP session (``Mcp-Session-Id``),
  kept in the SDK's per-connection ``state`` and released by its
  ``exit_stack`` when the session ends (DELETE, idle timeout, shutdown). The
  2026-07-28 era has no sessions (every request is its own connection), so
  this server advertises only the handshake versions in ``server/discover``:
  a client in ``auto`` mode falls back to the ``initialize`` handshake and
  gets a session; a client pinned to 2026-07-28 gets ``session_required``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from gateway.mcp import specs
from gateway.mcp.tools import RunTools, ToolAnswer

log = logging.getLogger("fencegate.mcp")

NAME = "fencegate"
INSTRUCTIONS = (
    "Tools of one agent run, fenced by the fencegate gateway. Call claim_run with the run's "
    "resource first; send_email and http_request then carry its fence. A repeated identical "
    "call is replayed, never sent twice. When a tool answers an error starting with "
    "stale_fence, lease_expired, no_lease, invalid_fence or run_released, the run is no "
    "longer yours: stop working on it.")
_STATE_KEY = "fencegate.run_tools"

MakeTools = Callable[[], RunTools]


def tool_list() -> list[types.Tool]:
    """The tools as MCP lists them."""
    return [types.Tool(
        name=t.name, title=t.title, description=t.description, input_schema=t.input_schema,
        annotations=types.ToolAnnotations(
            title=t.title, read_only_hint=t.read_only, destructive_hint=t.destructive,
            idempotent_hint=t.idempotent, open_world_hint=t.open_world))
        for t in specs.TOOLS]


def _result(answer: ToolAnswer) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=answer.text)],
                                structured_content=answer.data, is_error=answer.is_error)


def _connection(ctx: Any) -> Any:
    """The SDK's per-client ``Connection`` of a request. mcp 2.3 hands
    low-level handlers no public path to it (its ``Context.connection`` is
    not built by the runner yet), so it is read off the request's session;
    tests/integration/test_mcp_http.py fails if that moves."""
    return ctx.session._connection


class _PerProcess:
    """stdio: one run for the process."""

    def __init__(self, make: MakeTools) -> None:
        self._make = make
        self.tools: RunTools | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Server[Any]) -> AsyncIterator[Any]:
        self.tools = self._make()
        try:
            yield self
        finally:
            await self.tools.close()

    async def tools_for(self, ctx: Any) -> RunTools | ToolAnswer:
        assert self.tools is not None
        return self.tools


class _PerSession:
    """Streamable HTTP: one run per MCP session."""

    def __init__(self, make: MakeTools) -> None:
        self._make = make

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Server[Any]) -> AsyncIterator[Any]:
        yield self

    async def tools_for(self, ctx: Any) -> RunTools | ToolAnswer:
        connection = _connection(ctx)
        if connection.session_id is None:
            return ToolAnswer("session_required: this server keeps one run per MCP session; "
                              "connect with the initialize handshake (protocol "
                              f"{HANDSHAKE_PROTOCOL_VERSIONS[-1]}) to get one", True,
                              {"error": "session_required"})
        tools: RunTools | None = connection.state.get(_STATE_KEY)
        if tools is None:
            tools = connection.state[_STATE_KEY] = self._make()
            connection.exit_stack.push_async_callback(tools.close)
        return tools


def build_server(make: MakeTools, *, per_session: bool) -> Server[Any]:
    """The MCP server; ``make`` makes a session's ``RunTools`` (inside the
    event loop). ``per_session``: one run per MCP session (HTTP), else one
    for the process (stdio)."""
    holder: _PerProcess | _PerSession = _PerSession(make) if per_session else _PerProcess(make)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            tools = await holder.tools_for(ctx)
            if isinstance(tools, ToolAnswer):
                return _result(tools)
            return _result(await tools.call(params.name, params.arguments))
        except Exception:  # a bug must not end the session: the model gets an error
            log.exception("tool %s failed", params.name)
            return _result(ToolAnswer("internal_error: the tool failed; see the server's log",
                                      True, {"error": "internal_error"}))

    server: Server[Any] = Server(NAME, instructions=INSTRUCTIONS, lifespan=holder.lifespan,
                                 on_list_tools=list_tools, on_call_tool=call_tool)
    if per_session:
        async def discover(ctx: Any, params: Any) -> types.DiscoverResult:
            return types.DiscoverResult(supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
                                        capabilities=server.get_capabilities(),
                                        instructions=INSTRUCTIONS)

        server.add_request_handler("server/discover", types.RequestParams, discover)
    return server
