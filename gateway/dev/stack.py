"""``fencegate dev``: a whole working setup on one machine.

An embedded PostgreSQL (unless ``FENCEGATE_DATABASE_URL`` is set), an SMTP sink
and a webhook sink on loopback, a generated configuration and API key, and the
gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from leases import database, migrate

from ..app import build_app
from ..auth import key_sha256
from ..config import Config, load, parse
from .sinks import SmtpSink, WebhookSink

log = logging.getLogger("fencegate.dev")

DEV_GATEWAY_PORT = 8080
DEV_SMTP_PORT = 2525
DEV_WEBHOOK_PORT = 9000


def _free(port: int) -> int:
    """``port`` if it can be bound on loopback, else any free port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


def dev_api_key(home: Path) -> str:
    """The dev API key, made once and kept in ``.fencegate/dev-api-key``."""
    path = home / "dev-api-key"
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        path.write_text("fg_dev_" + secrets.token_urlsafe(18) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def dev_config_text(api_key: str, gateway_port: int, smtp_port: int,
                    webhook_port: int) -> str:
    """The dev configuration: one client, ``dev``, an operator (it may use the
    console), and the two sinks as providers."""
    return f"""# written by `fencegate dev`; edit a copy, not this file
[server]
host = "127.0.0.1"
port = {gateway_port}
max_body_bytes = 1048576

[database]
url_env = "FENCEGATE_DATABASE_URL"

[[clients]]
name = "dev"
key_sha256 = "{key_sha256(api_key)}"
resources = ["run:*", "lead:*", "job:*"]
role = "operator"

[providers.mail]
kind = "smtp"
host = "127.0.0.1"
port = {smtp_port}
tls = "none"
timeout_seconds = 10
rate_limit_per_second = 50
idempotency_header = ""
idempotency_window_seconds = 0

[providers.crm]
kind = "http"
base_url = "http://127.0.0.1:{webhook_port}/api"
timeout_seconds = 10
rate_limit_per_second = 100
idempotency_header = "Idempotency-Key"
idempotency_window_seconds = 86400
"""


def write_dev_config(home: Path, api_key: str, gateway_port: int, smtp_port: int,
                     webhook_port: int) -> Path:
    path = home / "dev.toml"
    path.write_text(dev_config_text(api_key, gateway_port, smtp_port, webhook_port))
    return path


@dataclass
class DevStack:
    url: str
    api_key: str
    config: Config
    #: where the configuration was written (None: kept in memory, as the demo does)
    config_path: Path | None
    dsn: str
    #: which database that is, in words
    database: str
    smtp: SmtpSink
    hook: WebhookSink


@contextlib.asynccontextmanager
async def dev_stack(gateway_port: int = DEV_GATEWAY_PORT, *,
                    own_files: bool = True) -> AsyncIterator[DevStack]:
    """The gateway, its sinks and the database. ``own_files``: the dev key and
    ``.fencegate/dev.toml`` are this stack's (``fencegate dev``); without it
    (``fencegate demo``) a key and a configuration are made up in memory, so a
    running ``fencegate dev`` is left alone."""
    home = database.home()
    where: list[str] = []
    dsn = database.database_url(say=where.append, guard=own_files)
    await migrate.migrate_dsn(dsn)
    smtp = await SmtpSink().start(port=_free(DEV_SMTP_PORT) if own_files else 0)
    hook = await WebhookSink().start(port=_free(DEV_WEBHOOK_PORT) if own_files else 0)
    port = _free(gateway_port) if gateway_port else 0
    if own_files:
        api_key = dev_api_key(home)
        path: Path | None = write_dev_config(home, api_key, port, smtp.port, hook.port)
        assert path is not None
        config = load(path)
    else:
        api_key, path = "fg_demo_" + secrets.token_urlsafe(18), None
        config = parse(tomllib.loads(dev_config_text(api_key, port, smtp.port, hook.port)),
                       "<demo>")
    runner = web.AppRunner(build_app(config, dsn, migrate_on_start=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield DevStack(f"http://127.0.0.1:{port}", api_key, config, path, dsn,
                       where[0] if where else f"{database.redacted(dsn)} "
                       f"({database.DATABASE_URL_ENV})", smtp, hook)
    finally:
        await runner.cleanup()
        await hook.close()
        await smtp.close()


def curl_guide(stack: DevStack) -> str:
    resource = f"run:demo-{secrets.token_hex(2)}"  # fresh each start: the guide re-runs
    auth = '-H "Authorization: Bearer $FG_KEY"'
    json_h = "-H 'Content-Type: application/json'"
    fence = "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"fence\"])'"
    email = ("'{\"from\": \"agent@example.com\", \"to\": [\"lead@example.com\"], "
             "\"subject\": \"Hello\", \"text\": \"Hi from fencegate\"}'")
    return f"""
fencegate dev is up.
  gateway      {stack.url}   (config: {stack.config_path})
  console      {stack.url}/console   (log in with the dev API key below)
  API docs     {stack.url}/docs      OpenAPI: {stack.url}/openapi.json
  metrics      {stack.url}/metrics
  SMTP sink    127.0.0.1:{stack.smtp.port}   (every accepted message is printed here)
  webhook sink http://127.0.0.1:{stack.hook.port}/api
  database     {stack.dsn}
               {stack.database}; `LeaseClient()` and the fencegate CLI
               run in this folder use it too (or export FENCEGATE_DATABASE_URL=<that DSN>)

Try it from another terminal:

  export FG={stack.url} FG_KEY={stack.api_key}

  # 1. worker-a claims {resource} and gets a fence
  FENCE=$(curl -s -X POST $FG/v1/leases/claim {auth} {json_h} \\
    -d '{{"resource": "{resource}", "owner": "worker-a", "ttl_seconds": 60}}' | {fence})
  echo "fence: $FENCE"

  # 2. send an email under that fence (200, "sent")
  curl -s $FG/v1/email {auth} {json_h} -H "Fence-Resource: {resource}" \\
    -H "Fence-Token: $FENCE" -H "Idempotency-Key: welcome-1" -d {email}

  # 3. the same again: replayed (Idempotent-Replayed: true), nothing sent
  curl -si $FG/v1/email {auth} {json_h} -H "Fence-Resource: {resource}" \\
    -H "Fence-Token: $FENCE" -H "Idempotency-Key: welcome-1" -d {email}

  # 4. worker-a lets go, worker-b claims: worker-a's fence is now stale (412 stale_fence)
  curl -s -X POST $FG/v1/leases/release {auth} {json_h} \\
    -d "{{\\"resource\\": \\"{resource}\\", \\"owner\\": \\"worker-a\\", \\"fence\\": $FENCE}}"
  curl -s -X POST $FG/v1/leases/claim {auth} {json_h} \\
    -d '{{"resource": "{resource}", "owner": "worker-b", "ttl_seconds": 60}}'
  curl -s $FG/v1/email {auth} {json_h} -H "Fence-Resource: {resource}" \\
    -H "Fence-Token: $FENCE" -H "Idempotency-Key: welcome-2" -d {email}

Ctrl-C stops everything.
"""


async def _report_deliveries(stack: DevStack) -> None:
    seen_mail = seen_hook = 0
    while True:
        await asyncio.sleep(0.2)
        for d in stack.smtp.deliveries[seen_mail:]:
            print(f"[smtp sink] message {d.header('Message-ID')} to {', '.join(d.recipients)}"
                  f" (fence {d.header('Fence-Token')}): {d.header('Subject')!r}", flush=True)
        for d in stack.hook.deliveries[seen_hook:]:
            print(f"[webhook sink] {d.method} {d.path} (fence {d.header('Fence-Token')})",
                  flush=True)
        seen_mail, seen_hook = len(stack.smtp.deliveries), len(stack.hook.deliveries)


async def run_dev(port: int = DEV_GATEWAY_PORT) -> None:
    async with dev_stack(port) as stack:
        print(curl_guide(stack), flush=True)
        await _report_deliveries(stack)
