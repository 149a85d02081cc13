"""``fencegate dev``: a whole working setup on one machine.

An embedded PostgreSQL (unless ``FENCEGATE_DATABASE_URL`` is set), an SMTP sink
and a webhook sink on loopback, a generated configuration and API key, and the
gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import socket
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gateway.api.auth import key_sha256
from gateway.app import build_app
from gateway.config import Config, load, parse
from gateway.dev import playground
from gateway.dev.sinks import SmtpSink, WebhookSink
from gateway.errors import ConfigError
from leases import database, migrate

log = logging.getLogger("fencegate.dev")

DEV_GATEWAY_PORT = 8080
DEV_SMTP_PORT = 2525
DEV_WEBHOOK_PORT = 9000


def _bindable(port: int) -> OSError | None:
    """Why ``port`` cannot be bound on loopback (None: it can), as the
    gateway's own site will bind it (address reuse on, so TIME_WAIT is free)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc
    return None


def gateway_port_or_refuse(port: int) -> int:
    """The gateway's port as asked: a port in use is an error that says what
    to do (as `fencegate serve` does), never a silent move elsewhere."""
    if port == 0:
        return 0
    exc = _bindable(port)
    if exc is None:
        return port
    why = "is in use (another fencegate dev?)" if exc.errno == errno.EADDRINUSE \
        else f"cannot be bound ({exc.strerror})"
    raise ConfigError(f"fencegate dev: 127.0.0.1:{port} {why}: stop what listens there, "
                      "or choose another port: fencegate dev --port N (0: any free port)")


def sink_port(name: str, port: int, notes: list[str]) -> int:
    """A sink's usual port, or any free one, with a note for the guide that
    says it moved (the dev configuration follows it)."""
    if _bindable(port) is None:
        return port
    notes.append(f"{name}: 127.0.0.1:{port} is in use, so it listens on another port "
                 "(the one shown below; dev.toml says the same)")
    return 0


class DevLock:
    """One `fencegate dev` per folder: the second would rewrite the first's
    ``dev.toml`` under it and share its database. An advisory lock on
    ``.fencegate/dev.lock``, released by the kernel however the holder ends."""

    def __init__(self, home: Path) -> None:
        self.path = home / "dev.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock, as before
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"fencegate dev is already running from {self.path.parent} ({holder}): "
                "use that one, or stop it first (Ctrl-C in its terminal)") from None
        self._fd = fd

    def note(self, text: str) -> None:
        """What a second `fencegate dev` is told about this one."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, text.encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
    #: what the guide must say about ports that moved
    notes: list[str]


@contextlib.asynccontextmanager
async def dev_stack(gateway_port: int = DEV_GATEWAY_PORT, *, own_files: bool = True,
                    playground: bool = False) -> AsyncIterator[DevStack]:
    """The gateway, its sinks and the database. ``own_files``: the dev key and
    ``.fencegate/dev.toml`` are this stack's (``fencegate dev``); without it
    (``fencegate demo``) a key and a configuration are made up in memory, so a
    running ``fencegate dev`` is left alone. ``playground``: the console's
    playground page (gateway/dev/playground.py) is served too."""
    home = database.home()
    lock = DevLock(home)
    if own_files:
        lock.acquire()
    try:
        async with _started(home, gateway_port, own_files, lock, playground) as stack:
            yield stack
    finally:
        lock.release()


@contextlib.asynccontextmanager
async def _started(home: Path, gateway_port: int, own_files: bool, lock: DevLock,
                   with_playground: bool) -> AsyncIterator[DevStack]:
    port = gateway_port_or_refuse(gateway_port)
    where: list[str] = []
    notes: list[str] = []
    dsn = database.database_url(say=where.append, guard=own_files, create=True)
    await migrate.migrate_dsn(dsn)
    smtp = await SmtpSink().start(
        port=sink_port("SMTP sink", DEV_SMTP_PORT, notes) if own_files else 0)
    hook = await WebhookSink().start(
        port=sink_port("webhook sink", DEV_WEBHOOK_PORT, notes) if own_files else 0)
    try:
        if own_files:
            api_key = dev_api_key(home)
            path: Path | None = write_dev_config(home, api_key, port, smtp.port, hook.port)
            assert path is not None
            config = load(path)
        else:
            api_key, path = "fg_demo_" + secrets.token_urlsafe(18), None
            config = parse(tomllib.loads(dev_config_text(api_key, port, smtp.port, hook.port)),
                           "<demo>")
        app = build_app(config, dsn, migrate_on_start=False)
        game = playground.enable(app, dsn, api_key, hook) if with_playground else None
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", port)
            await site.start()
            port = runner.addresses[0][1]
            url = f"http://127.0.0.1:{port}"
            if game is not None:
                game.url = url
            lock.note(f"pid {os.getpid()}, {url}")
            if own_files and path is not None and gateway_port == 0:
                # the port the gateway got, so dev.toml says where it is
                write_dev_config(home, api_key, port, smtp.port, hook.port)
            yield DevStack(url, api_key, config, path, dsn,
                           where[0] if where else f"{database.redacted(dsn)} "
                           f"({database.DATABASE_URL_ENV})", smtp, hook, notes)
        finally:
            await runner.cleanup()
    finally:
        await hook.close()
        await smtp.close()


def curl_guide(stack: DevStack) -> str:
    # fresh each start, the keys too: the guide re-run against the same
    # database must send again, not replay the last session's email
    run = secrets.token_hex(3)
    resource = f"run:demo-{run}"
    auth = '-H "Authorization: Bearer $FG_KEY"'
    json_h = "-H 'Content-Type: application/json'"
    fence = "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"fence\"])'"
    email = ("'{\"from\": \"agent@example.com\", \"to\": [\"lead@example.com\"], "
             "\"subject\": \"Hello\", \"text\": \"Hi from fencegate\"}'")
    moved = "".join(f"\n  note: {n}" for n in stack.notes)
    return f"""
fencegate dev is up.{moved}
  gateway      {stack.url}   (config: {stack.config_path})
  console      {stack.url}/console   (log in with the dev API key below)
  playground   {stack.url}/console/dev/playground   (the job platform, from buttons)
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

  # 2. send an email under that fence (200, "sent"; the SMTP sink prints it)
  curl -si $FG/v1/email {auth} {json_h} -H "Fence-Resource: {resource}" \\
    -H "Fence-Token: $FENCE" -H "Idempotency-Key: welcome-{run}" -d {email}

  # 3. the same again: replayed (Idempotent-Replayed: true), nothing sent
  curl -si $FG/v1/email {auth} {json_h} -H "Fence-Resource: {resource}" \\
    -H "Fence-Token: $FENCE" -H "Idempotency-Key: welcome-{run}" -d {email}

  # 4. worker-a lets go, worker-b claims: worker-a's fence is now stale (412 stale_fence)
  curl -s -X POST $FG/v1/leases/release {auth} {json_h} \\
    -d "{{\\"resource\\": \\"{resource}\\", \\"owner\\": \\"worker-a\\", \\"fence\\": $FENCE}}"
  curl -s -X POST $FG/v1/leases/claim {auth} {json_h} \\
    -d '{{"resource": "{resource}", "owner": "worker-b", "ttl_seconds": 60}}'
  curl -s $FG/v1/email {auth} {json_h} -H "Fence-Resource: {resource}" \\
    -H "Fence-Token: $FENCE" -H "Idempotency-Key: welcome-{run}-2" -d {email}

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


class _TerminalLines(logging.Handler):
    """The gateway's effect lines and the console's actions, as plain lines
    beside the sinks' (the JSON log of `fencegate serve` is for machines)."""

    def __init__(self, tag: str) -> None:
        super().__init__(logging.INFO)
        self.tag = tag

    def emit(self, record: logging.LogRecord) -> None:
        print(f"[{self.tag}] {record.getMessage()}", flush=True)


def show_gateway_lines() -> None:
    """Every effect (sent, replayed, refused by fence) and every console
    action on the dev terminal."""
    for name, tag in (("fencegate.effects", "gateway"), ("fencegate.console", "console")):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.handlers[:] = [_TerminalLines(tag)]


async def run_dev(port: int = DEV_GATEWAY_PORT) -> None:
    show_gateway_lines()
    async with dev_stack(port, playground=True) as stack:
        print(curl_guide(stack), flush=True)
        await _report_deliveries(stack)
