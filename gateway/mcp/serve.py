"""``fencegate mcp``: the MCP server over stdio (the default) or streamable
HTTP (``--http HOST:PORT``, the endpoint at ``/mcp``)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Final

from gateway.errors import ConfigError

API_KEY_ENV: Final = "FENCEGATE_API_KEY"
SENDER_ENV: Final = "FENCEGATE_MCP_FROM"
#: where the streamable HTTP endpoint is served
HTTP_PATH: Final = "/mcp"


def host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6), or ConfigError."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--http {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``mcp`` subcommand."""
    p = sub.add_parser("mcp", help="an MCP server whose email and HTTP tools are fenced per run",
                       description="A Model Context Protocol server: tools claim_run, "
                       "send_email, http_request, release_run and run_status, sent through "
                       f"the gateway at --gateway with the API key in ${API_KEY_ENV}.")
    p.add_argument("--gateway", required=True, help="the gateway's URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--http", metavar="HOST:PORT",
                   help=f"serve streamable HTTP at http://HOST:PORT{HTTP_PATH} (one run per "
                   "MCP session) instead of stdio")
    p.add_argument("--from", dest="sender", default=os.environ.get(SENDER_ENV),
                   help=f"the sender of emails that name none (default: ${SENDER_ENV})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until stdin closes (stdio) or the process is stopped (HTTP)."""
    try:
        import anyio

        from gateway.mcp.server import build_server
    except ImportError as exc:
        raise ConfigError(f"fencegate mcp needs the MCP SDK ({exc.name} is missing): "
                          "pip install 'fencegate[mcp]'") from None
    from gateway.mcp.tools import RunTools

    key = os.environ.get(API_KEY_ENV)
    if not key:
        raise ConfigError(f"no API key: set {API_KEY_ENV} to the key of a gateway client")
    if not args.gateway.startswith(("http://", "https://")):
        raise ConfigError(f"--gateway {args.gateway!r}: expected an http:// or https:// URL")
    address = host_port(args.http) if args.http else None

    def make() -> RunTools:
        return RunTools(args.gateway, key, default_sender=args.sender)

    server = build_server(make, per_session=address is not None)
    if address is None:
        from mcp.server.stdio import stdio_server

        async def stdio() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(stdio)
        return 0

    import uvicorn

    host, port = address
    try:  # bound here, so a port in use is a message that names it, not a log line
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host
                                    else socket.AF_INET)
    except OSError as exc:
        raise ConfigError(f"--http {args.http}: cannot listen there: "
                          f"{exc.strerror or exc}") from None
    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    shown = f"[{host}]" if ":" in host else host
    print(f"fencegate mcp: serving MCP on http://{shown}:{port}{HTTP_PATH} "
          f"(gateway {args.gateway})", file=sys.stderr, flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
