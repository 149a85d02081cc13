"""The ``fencegate`` command line."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import importlib.metadata
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, get_args

import asyncpg

from gateway.errors import ConfigError
from gateway.ledger import Ledger
from gateway.mcp import serve as mcp_serve
from gateway.wire import EffectState
from leases import Database, formats, jobs_cli, logs
from leases import cli as leases_cli
from leases.errors import LeasesError

CONFIG_ENV = "FENCEGATE_CONFIG"
#: `fencegate effects list`, as a table with a header row like `jobs list`
EFFECT_COLUMNS = ("state", "client", "idempotency_key", "resource", "fence", "provider",
                  "created_at")


def _config_path(args: argparse.Namespace) -> str:
    path = args.config or os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"no configuration: pass --config FILE or set {CONFIG_ENV}")
    return str(path)


def _serve(args: argparse.Namespace) -> int:
    from gateway.serve import serve

    return serve(_config_path(args), args.workers)


#: what ends `fencegate dev` as Ctrl-C does: a closed terminal, `tmux kill-session`
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP end `fencegate dev` as Ctrl-C does, so the embedded
    PostgreSQL is stopped on the way out rather than left running. (A SIGKILL
    runs nothing: the guard of leases.embedded stops the server then.) This
    covers the start, before the event loop runs; ``_until_signalled`` the
    rest."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in ENDING_SIGNALS:
        signal.signal(sig, handler)


async def _until_signalled(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` until SIGTERM or SIGHUP, which cancel it as Ctrl-C does.
    Through the event loop: an exception raised by a signal handler lands
    wherever the loop happens to be, and code there that waits out or
    retries a failure could swallow it (a `fencegate dev` kept running)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in ENDING_SIGNALS:
        loop.add_signal_handler(sig, task.cancel)
    try:
        await main
    finally:
        for sig in ENDING_SIGNALS:
            loop.remove_signal_handler(sig)


def _dev(args: argparse.Namespace) -> int:
    try:
        from gateway.dev.stack import run_dev
    except ImportError as exc:
        print(f"fencegate dev needs the dev tools ({exc.name} is missing): "
              "pip install 'fencegate[dev,embedded]', or run `make run`", file=sys.stderr)
        return 2

    logs.setup(logging.WARNING)
    _interrupt_on_signals()
    try:
        asyncio.run(_until_signalled(run_dev(args.port)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    return 0


def _demo(args: argparse.Namespace) -> int:
    try:
        from gateway.dev.demo import run_demo
        from gateway.dev.queue_demo import run_queue_demo
    except ImportError as exc:
        print(f"fencegate demo needs the dev tools ({exc.name} is missing): "
              "pip install 'fencegate[dev,embedded]'", file=sys.stderr)
        return 2

    logs.setup(logging.ERROR)
    return asyncio.run(run_queue_demo() if args.scenario == "queue" else run_demo())


def _effects(args: argparse.Namespace) -> int:
    async def run(pool: asyncpg.Pool) -> int:
        ledger = Ledger(Database(pool=pool, timeout=10.0))
        if args.verb in ("show", "resolve") and args.client is None:
            clients = await ledger.clients_of(args.key)
            if len(clients) != 1:
                print(f"no such effect: {args.key!r}" if not clients else
                      f"{args.key!r} names effects of several clients "
                      f"({', '.join(clients)}): pass --client", file=sys.stderr)
                return 1
            args.client = clients[0]
        if args.verb == "show":
            effect = await ledger.show(args.client, args.key)
            if effect is None:
                print(f"no such effect: {args.key!r} for client {args.client!r}",
                      file=sys.stderr)
                return 1
            leases_cli.emit(args, effect, "\n".join(
                f"{k:>18}: {formats.text(v)}" for k, v in effect.items()))
            return 0
        if args.verb == "list":
            rows = await ledger.list(args.client, args.state, args.limit)
            leases_cli.emit(args, rows, jobs_cli.table(rows, EFFECT_COLUMNS)
                            if rows else "no effects")
            return 0
        return await _resolve(args, ledger)

    return leases_cli.run_with_pool(run)


def _operator() -> str:
    """Who resolves from the command line, as the resolution records it."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a container's)
        return f"cli:uid {os.getuid()}"


async def _resolve(args: argparse.Namespace, ledger: Ledger) -> int:
    ok = await ledger.resolve(args.client, args.key, args.outcome, operator=_operator())
    reason = None
    if ok:
        text = f"{args.key}: resolved as {args.outcome}"
    else:
        why = await ledger.why_unresolved(args.client, args.key, args.outcome)
        reason, text = why.code, (
            f"no such effect: {args.key!r} for client {args.client!r}"
            if why.code == "not_found" else f"{args.key}: not resolved: {why.detail}")
    data = {"idempotency_key": args.key, "resolved": ok, **({"reason": reason} if reason else {})}
    if args.json:
        leases_cli.emit(args, data, text)
    else:
        print(text, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _version() -> str:
    try:
        return importlib.metadata.version("fencegate")
    except importlib.metadata.PackageNotFoundError:  # run from a tree never installed
        return "(not installed)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fencegate", description="Fenced leases and a side-effect gateway."
    )
    p.add_argument("--version", action="version", version=f"fencegate {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help=f"TOML configuration (default: ${CONFIG_ENV})")
    serve.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    serve.set_defaults(func=_serve)
    dev = sub.add_parser("dev", help="embedded database, local sinks, a dev key: try it")
    dev.add_argument("--port", type=int, default=8080,
                     help="the gateway's port (default 8080; 0: any free port)")
    dev.set_defaults(func=_dev)
    demo = sub.add_parser("demo", help="the zombie-worker scenario (or the job platform's: "
                          "demo queue) as a timeline")
    demo.add_argument("scenario", nargs="?", choices=["zombie", "queue"], default="zombie",
                      help="zombie (default): a stalled worker refused at the gateway; "
                      "queue: a charge deduplicated, a flaky job retried, a poison job "
                      "replayed")
    demo.set_defaults(func=_demo)
    leases_cli.add_commands(sub)
    jobs_cli.add_commands(sub)
    mcp_serve.add_command(sub)

    effects = sub.add_parser("effects", help="inspect and resolve effects")
    verbs = effects.add_subparsers(dest="verb", required=True)
    show = verbs.add_parser("show", help="one effect")
    show.add_argument("key", help="the idempotency key")
    show.add_argument("--client", help="the client that sent it (needed only when "
                     "effects of several clients share the key)")
    lst = verbs.add_parser("list", help="recent effects")
    lst.add_argument("--client", help="one client's effects (default: every client's)")
    lst.add_argument("--state", choices=list(get_args(EffectState)),
                     help="only effects in this state")
    lst.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    res = verbs.add_parser("resolve", help="settle an effect whose outcome is unknown")
    res.add_argument("key", help="the idempotency key")
    res.add_argument("--client", help="the client that sent it (needed only when "
                     "effects of several clients share the key)")
    res.add_argument("--outcome", required=True, choices=["sent", "not_sent"],
                     help="what the provider says happened")
    for v in (show, lst, res):
        v.add_argument("--json", action="store_true", help="print JSON")
        v.set_defaults(func=_effects)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, LeasesError) as exc:  # e.g. no database and no embedded one
        print(f"fencegate: {exc}", file=sys.stderr)
        return 2
    except (OSError, asyncpg.PostgresError) as exc:  # what no step above mapped
        print(f"fencegate: {exc or type(exc).__name__}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
