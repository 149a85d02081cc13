"""Agents' tools fenced per run: ``fencegate mcp`` (a Model Context Protocol
server, ``gateway.mcp.server``) and the same tools as a plain Python object,
``RunTools``, for frameworks that do not speak MCP (``gateway.mcp.adapter``).

    specs.py      the five tools as data: names, schemas, annotations
    arguments.py  a call's arguments checked against its schema
    run.py        one run's lease over the gateway's lease API, kept renewed
    tools.py      RunTools: the tools of one run, answering ToolAnswer
    adapter.py    RunTools as plain async functions, for any framework
    server.py     the MCP server (the SDK's low-level Server)
    serve.py      the ``fencegate mcp`` command: stdio or streamable HTTP
"""

from gateway.mcp.run import RunLost
from gateway.mcp.tools import RunTools, ToolAnswer

__all__ = ["RunLost", "RunTools", "ToolAnswer"]
