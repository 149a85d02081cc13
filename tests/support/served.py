"""A gateway as a real process: ``fencegate serve`` started in a subprocess,
returned once it answers ``/readyz``; ``serve_gateway`` writes the usual
configuration around the providers a test gives it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

from gateway.api.auth import key_sha256
from tests.support.waiting import GENEROUS_SECONDS

#: the command line, as a user runs it, in this interpreter
FENCEGATE = [sys.executable, "-m", "gateway.cli"]


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serve(tmp_path: Path, config: str, port: int, dsn: str, *args: str,
                env: dict[str, str] | None = None,
                seconds: float = GENEROUS_SECONDS) -> tuple[subprocess.Popen[bytes], str]:
    """Write ``config`` (which listens on ``port`` and reads its database URL
    from ``FG_TEST_DSN``) to ``tmp_path/gw.toml``, start ``fencegate serve``
    on it (``args`` added, ``env`` over this environment), its stderr in
    ``tmp_path/serve.log``, and return the process and its URL once it is
    ready. A gateway not ready within ``seconds`` is killed and fails the
    test with its log."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text(config)
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([*FENCEGATE, "serve", "--config", str(cfg), *args],
                                env={**os.environ, "FG_TEST_DSN": dsn, **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with aiohttp.ClientSession() as http:
        while loop.time() < deadline and proc.poll() is None:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/readyz") as r:
                    if r.status == 200:
                        return proc, url
            await asyncio.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    raise AssertionError(f"the gateway never became ready: {log.read_text()[-2000:]}")


#: the API key of the one client ``serve_gateway`` configures (``agents``)
API_KEY = "k"


async def serve_gateway(tmp_path: Path, dsn: str, providers: str, *, server: str = "",
                        database: str = "", args: tuple[str, ...] = (),
                        env: dict[str, str] | None = None,
                        ) -> tuple[subprocess.Popen[bytes], str]:
    """``serve`` a gateway on a free port with the database at ``dsn``, one
    client ``agents`` (API key ``API_KEY``, resources ``run:*``) and
    ``providers`` (TOML tables); ``server`` and ``database`` add keys to
    those tables."""
    port = free_port()
    config = f"""
[server]
port = {port}
{server}
[database]
url_env = "FG_TEST_DSN"
{database}
[[clients]]
name = "agents"
key_sha256 = "{key_sha256(API_KEY)}"
resources = ["run:*"]
{providers}"""
    return await serve(tmp_path, config, port, dsn, *args, env=env)
