"""``fencegate migrate`` and ``fencegate lease ...``: the lease manager from a shell."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from . import database, formats, migrate
from .client import LeaseClient
from .errors import LeasesError, Unavailable

Handler = Callable[[argparse.Namespace, LeaseClient], Awaitable[int]]


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON with --json, else the readable ``text``."""
    if getattr(args, "json", False):
        print(formats.to_json(data))
    else:
        print(text)


def say_database(sentence: str) -> None:
    """Tell which database a command runs on (stderr: --json output stays clean)."""
    print(f"fencegate: database: {sentence}", file=sys.stderr)


#: what the driver raises when it cannot connect or log in
CONNECT_ERRORS = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


async def migrated_dsn() -> str:
    """The configured (or embedded) database, migrated to this version; an
    ``Unavailable`` that says which database and why if it cannot be reached."""
    dsn = database.database_url(say=say_database)
    try:
        await migrate.migrate_dsn(dsn)
    except CONNECT_ERRORS as exc:
        raise Unavailable(f"cannot reach the database at {database.redacted(dsn)}: "
                          f"{exc or type(exc).__name__}") from exc
    return dsn


async def connect_migrated() -> asyncpg.Pool:
    """A pool on the configured (or embedded) database, migrated to this version."""
    return await database.create_pool(await migrated_dsn(), min_size=1, max_size=2)


def run_cli(main: Callable[[], Awaitable[int]]) -> int:
    """Run one command; a LeasesError becomes a clear message and exit status 2,
    never a traceback."""
    try:
        return asyncio.run(main())  # type: ignore[arg-type]
    except LeasesError as exc:
        print(f"fencegate: {exc}", file=sys.stderr)
        return 2


def run_with_pool(fn: Callable[[asyncpg.Pool], Awaitable[int]]) -> int:
    """Run one command on a pool to the migrated database."""
    async def main() -> int:
        pool = await connect_migrated()
        try:
            return await fn(pool)
        finally:
            await pool.close()

    return run_cli(main)


def run_with_client(handler: Handler, args: argparse.Namespace) -> int:
    async def run(pool: asyncpg.Pool) -> int:
        client = LeaseClient(pool=pool, owner=args.owner)
        try:
            return await handler(args, client)
        finally:  # before the pool closes: the abandon of a claim left unanswered
            await client.close()

    return run_with_pool(run)


OWNER_NEEDED = (
    "fencegate: {verb} needs --owner, the owner that claimed the lease. Owners are per "
    "process: `fencegate lease claim` without --owner claims under an owner of its own, "
    "which ended with that command. Claim with --owner NAME, then pass the same "
    "--owner NAME to renew and release (e.g. fencegate lease {verb} {resource} --fence F "
    "--owner NAME)."
)


def _run_lease_verb(handler: Handler, args: argparse.Namespace) -> int:
    if args.verb in ("renew", "release") and not args.owner:
        print(OWNER_NEEDED.format(verb=args.verb, resource=args.resource), file=sys.stderr)
        return 2
    return run_with_client(handler, args)


def _lease_text(verb: str, data: dict[str, Any]) -> str:
    return (f"{verb} {data['resource']}: owner {data['owner']}, fence {data['fence']}, "
            f"expires {formats.timestamp(data['expires_at'])}")


async def _claim(args: argparse.Namespace, client: LeaseClient) -> int:
    lease = await client.claim(args.resource, args.ttl)
    if lease is None:
        emit(args, {"resource": args.resource, "claimed": False},
             f"{args.resource} is held by another owner")
        return 1
    data = {"resource": lease.resource, "owner": lease.owner, "fence": lease.fence,
            "expires_at": lease.expires_at, "ttl_seconds": lease.ttl}
    hint = "" if args.owner else (" (an owner made up for this command: claim with --owner "
                                  "NAME to renew or release it later)")
    emit(args, data, _lease_text("claimed", data) + hint)
    return 0


async def _renew(args: argparse.Namespace, client: LeaseClient) -> int:
    expires_at = await client.renew(args.resource, client.owner, args.fence, args.ttl)
    if expires_at is None:
        emit(args, {"resource": args.resource, "renewed": False},
             f"{args.resource}: lease lost (expired, released, or another owner or fence)")
        return 1
    data = {"resource": args.resource, "owner": client.owner, "fence": args.fence,
            "expires_at": expires_at, "ttl_seconds": args.ttl}
    emit(args, data, _lease_text("renewed", data))
    return 0


async def _release(args: argparse.Namespace, client: LeaseClient) -> int:
    released = await client.release(args.resource, client.owner, args.fence)
    emit(args, {"resource": args.resource, "released": released},
         f"{args.resource}: {'released' if released else 'not held by this owner and fence'}")
    return 0 if released else 1


async def _show(args: argparse.Namespace, client: LeaseClient) -> int:
    info = await client.show(args.resource)
    if info is None:
        emit(args, {"resource": args.resource, "fence": None, "live": False},
             f"{args.resource}: no lease was ever granted")
        return 1
    data = {"resource": info.resource, "owner": info.owner, "fence": info.fence,
            "expires_at": info.expires_at, "live": info.live}
    state = "live" if info.live else "not live"
    emit(args, data, f"{info.resource}: {state}, owner {info.owner}, fence {info.fence}, "
                     f"expires {formats.timestamp(info.expires_at)}")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    async def main() -> int:
        dsn = database.database_url(say=say_database, create=True)
        try:
            applied = await migrate.migrate_dsn(dsn)
        except CONNECT_ERRORS as exc:
            raise Unavailable(f"cannot reach the database at {database.redacted(dsn)}: "
                              f"{exc or type(exc).__name__}") from exc
        version = migrate.latest_version()
        emit(args, {"applied": applied, "version": version},
             f"applied {applied}" if applied else f"already at schema version {version}")
        return 0

    return run_cli(main)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``migrate`` and ``lease`` to the ``fencegate`` command line."""
    p = sub.add_parser("migrate", help="apply database migrations")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_migrate)

    lease = sub.add_parser("lease", help="claim, renew, release or show a lease")
    verbs = lease.add_subparsers(dest="verb", required=True)

    def verb(name: str, handler: Handler, help_: str, fence: bool, ttl: bool) -> None:
        v = verbs.add_parser(name, help=help_)
        v.add_argument("resource", help="the resource, e.g. run:42")
        if fence:
            v.add_argument("--fence", type=int, required=True,
                           help="the fence your claim returned")
        if ttl:
            v.add_argument("--ttl", type=float, default=30.0, help="seconds (default 30)")
        v.add_argument("--owner", help="owner id; renew and release need the one that "
                       "claimed (default for claim: unique to this command)"
                       if name != "show" else argparse.SUPPRESS)
        v.add_argument("--json", action="store_true", help="print JSON")
        v.set_defaults(func=lambda args: _run_lease_verb(handler, args))

    verb("claim", _claim, "claim a lease", fence=False, ttl=True)
    verb("renew", _renew, "renew a lease you hold", fence=True, ttl=True)
    verb("release", _release, "release a lease you hold", fence=True, ttl=False)
    verb("show", _show, "show a resource's lease", fence=False, ttl=False)
