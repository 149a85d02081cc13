"""Errors of the ``leases`` package.

    LeasesError
    ├── LeaseLost                the guarded block was cancelled: ownership is gone
    │   └── FenceRefused         the database refused a fenced write (SQLSTATE FG412):
    │                            the caller's transaction rolls back
    ├── Unavailable              the database gave no answer (unreachable, too slow):
    │                            not a refusal, and what was asked may have happened
    ├── Busy                     no connection of the pool was free in time: nothing
    │                            was sent (this process is overloaded, not the database)
    ├── SchemaError
    │   └── SchemaTooNew         the database was migrated by a newer fencegate
    ├── EmbeddedDatabaseUnavailable  no database configured, and no embedded one to start
    │   └── NoDatabase           none configured and none made here: start one with
    │                            `fencegate dev` (or `make run`), or set the URL
    ├── BadDatabaseUrl           FENCEGATE_DATABASE_URL (or the configured variable) is
    │                            not a PostgreSQL URL
    └── InvalidArgument          a resource, owner or ttl out of bounds

Losing a claim race is not an error: ``claim`` answers ``None``.
"""

from __future__ import annotations

from typing import Literal

LostReason = Literal["taken", "expired", "unreachable"]


class LeasesError(Exception):
    """Base of every error raised by ``leases``."""


class InvalidArgument(LeasesError, ValueError):
    """A resource, owner or ttl outside what the contract allows."""


class LeaseLost(LeasesError):
    """Ownership could not be proven, so the guarded work was cancelled.

    ``reason`` tells the cases apart:

    - ``"taken"``: the database refused a renewal (the lease expired, was
      released, or another owner claimed it);
    - ``"expired"``: the local safety deadline passed with no renewal even
      attempted (the process was paused: GC, SIGSTOP, a laptop lid);
    - ``"unreachable"``: renewals were attempted but none got an answer before
      the safety deadline (database down, network partition).
    """

    def __init__(self, resource: str, fence: int, reason: LostReason, detail: str = "") -> None:
        self.resource = resource
        self.fence = fence
        self.reason: LostReason = reason
        message = f"lease on {resource!r} (fence {fence}) lost: {reason}"
        super().__init__(f"{message} ({detail})" if detail else message)


#: the reasons of FG412, the refusal of a fenced write (CONTRACT.md, "Fenced
#: writes in your own transaction"): the message of the database's error
FenceRefusal = Literal["stale_fence", "lease_expired", "no_lease", "invalid_fence"]

#: the SQLSTATE of that refusal
FENCE_REFUSED_SQLSTATE = "FG412"


class FenceRefused(LeaseLost):
    """The database refused a write fenced by this lease inside the caller's
    transaction (``fencegate_check_fence``, ``fencegate_complete_job``):
    ``code`` says why (a newer fence, a lapsed lease, no lease, a fence never
    issued). The transaction is aborted: nothing it wrote commits."""

    def __init__(self, resource: str, fence: int, code: FenceRefusal, detail: str = "") -> None:
        self.code: FenceRefusal = code
        super().__init__(resource, fence, "taken", f"{code}: {detail}" if detail else code)


class Unavailable(LeasesError):
    """The database gave no answer: it could not be reached, the connection
    broke, or it did not answer in time. Not a refusal: a statement sent may
    still have been carried out. Every such failure of the driver becomes this
    one exception, in one place (``leases.database.answered``)."""


class Busy(LeasesError):
    """Every connection of the pool stayed in use longer than the caller would
    wait: nothing was sent to the database. This process is overloaded; the
    database may be fine. Not ``Unavailable``: an operator paged for a database
    outage would look in the wrong place."""


class SchemaError(LeasesError):
    """The database schema cannot be used by this version."""


class SchemaTooNew(SchemaError):
    """The database was migrated by a newer fencegate than this one."""


class EmbeddedDatabaseUnavailable(LeasesError):
    """``FENCEGATE_DATABASE_URL`` is unset and the embedded PostgreSQL cannot be
    started here; the message says what to install or set."""


class NoDatabase(EmbeddedDatabaseUnavailable):
    """``FENCEGATE_DATABASE_URL`` is unset and no embedded database exists in
    the nearest ``.fencegate/``. Only ``fencegate dev``, ``fencegate migrate``
    and ``make`` make one: anything else making an empty database where it
    happens to run would answer about the wrong data."""


class BadDatabaseUrl(LeasesError):
    """The database URL given is not one: the message names where it came from
    and never repeats it (it may hold a password)."""
