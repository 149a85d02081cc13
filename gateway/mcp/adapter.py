"""``RunTools`` for agent frameworks that do not speak MCP: each tool as a
plain async function with a name, a description and a JSON Schema, the three
things every framework's "function tool" is made of.

    async with RunTools(url, key) as run:
        tools = function_tools(run)
        # LangChain / LangGraph: StructuredTool.from_function(coroutine=t.call,
        #     name=t.name, description=t.description, args_schema=t.parameters)
        # OpenAI Agents SDK: FunctionTool(name=t.name, description=t.description,
        #     params_json_schema=t.parameters, on_invoke_tool=lambda ctx, a: t.call(a))
        # PydanticAI: Tool.from_schema(t.call, name=t.name,
        #     description=t.description, json_schema=t.parameters)
        # any chat API that takes OpenAI-style tools: [t.openai() for t in tools]

``call`` answers the text a model reads (an error's text starts with its code:
``stale_fence``... means stop); ``run`` answers the whole ``ToolAnswer`` for
code that branches on it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from gateway.mcp import specs
from gateway.mcp.tools import RunTools, ToolAnswer


@dataclass(frozen=True)
class FunctionTool:
    """One tool of a ``RunTools``, as a framework wants it."""

    name: str
    description: str
    #: the JSON Schema of the arguments (an object)
    parameters: dict[str, Any]
    read_only: bool
    destructive: bool
    idempotent: bool
    tools: RunTools

    async def run(self, arguments: dict[str, Any] | str | None = None, /,
                  **kwargs: Any) -> ToolAnswer:
        """Call the tool with ``arguments`` (a dict, or its JSON text as some
        frameworks pass it) and/or keyword arguments; never raises for bad
        input (a ``bad_request`` answer)."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):  # nested too deep: RecursionError
                return ToolAnswer("bad_request: the arguments are not JSON", True,
                                  {"error": "bad_request"})
        if arguments is not None and not isinstance(arguments, dict):
            return await self.tools.call(self.name, arguments)
        return await self.tools.call(self.name, {**(arguments or {}), **kwargs})

    async def call(self, arguments: dict[str, Any] | str | None = None, /,
                   **kwargs: Any) -> str:
        """``run``, answering only the text a model reads."""
        return (await self.run(arguments, **kwargs)).text

    def openai(self) -> dict[str, Any]:
        """The tool in the OpenAI function-calling shape, which most chat APIs
        and LangChain's ``bind_tools`` accept."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": self.parameters}}


def function_tools(tools: RunTools) -> list[FunctionTool]:
    """The five tools of ``tools`` (one run), in the order of ``specs.TOOLS``."""
    return [FunctionTool(t.name, t.description, copy.deepcopy(t.input_schema), t.read_only,
                         t.destructive, t.idempotent, tools) for t in specs.TOOLS]
