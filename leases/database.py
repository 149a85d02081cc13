"""Where the database is: ``FENCEGATE_DATABASE_URL``, or an embedded PostgreSQL.

With the variable unset, PostgreSQL from the ``pgserver`` wheel runs in
``.fencegate/pgdata`` (under the current directory, or ``FENCEGATE_HOME``). The
folder is reused across runs; the server stops when the last process that
started it exits.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

DATABASE_URL_ENV = "FENCEGATE_DATABASE_URL"
HOME_ENV = "FENCEGATE_HOME"
DEFAULT_HOME = ".fencegate"

_embedded: dict[Path, Any] = {}


def home() -> Path:
    """The folder for local state (embedded database, dev configuration)."""
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).resolve()


def start_embedded(data_dir: Path | None = None) -> str:
    """Start (or join) the embedded PostgreSQL and answer its DSN."""
    data_dir = (data_dir or home() / "pgdata").resolve()
    server = _embedded.get(data_dir)
    if server is None:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        logging.getLogger("pgserver").setLevel(logging.WARNING)  # it narrates every step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: no XDG_RUNTIME_DIR
            import pgserver

            server = pgserver.get_server(  # type: ignore[attr-defined]
                str(data_dir), cleanup_mode="stop"
            )
        _embedded[data_dir] = server
    return str(server.get_uri())


def database_url() -> str:
    """The DSN to use: the environment's, or the embedded server's."""
    return os.environ.get(DATABASE_URL_ENV) or start_embedded()


async def _leave_session_as_is(conn: asyncpg.Connection) -> None:
    """fencegate leaves no session state on a pooled connection (no SET, LISTEN,
    cursor or advisory lock; an open transaction is still rolled back by asyncpg
    itself), so the reset query asyncpg would otherwise send on every release
    is a wasted round trip: it doubled the database calls of an effect."""


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10,
                      **kwargs: Any) -> asyncpg.Pool:
    """An asyncpg pool as fencegate uses it: one round trip per statement."""
    kwargs.setdefault("reset", _leave_session_as_is)
    pool: asyncpg.Pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size,
                                                   **kwargs)
    return pool


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
