"""Fenced leases on PostgreSQL: the lease manager, the lease client and the work queue."""

from .client import LeaseClient, LeaseInfo
from .db import Database
from .errors import (
    Busy,
    FenceRefused,
    InvalidArgument,
    LeaseLost,
    LeasesError,
    SchemaError,
    SchemaTooNew,
    Unavailable,
)
from .lease import Lease
from .periodic import Schedule, Scheduler
from .policy import RenewalPolicy
from .queue import Job, NewJob, Queue
from .queue_admin import Cancel, Snooze
from .retry import RetryDecision, RetryPolicy
from .worker import Worker

__all__ = [
    "Busy",
    "Cancel",
    "Database",
    "FenceRefused",
    "InvalidArgument",
    "Job",
    "Lease",
    "LeaseClient",
    "LeaseInfo",
    "LeaseLost",
    "LeasesError",
    "NewJob",
    "Queue",
    "RenewalPolicy",
    "RetryDecision",
    "RetryPolicy",
    "Schedule",
    "Scheduler",
    "SchemaError",
    "SchemaTooNew",
    "Snooze",
    "Unavailable",
    "Worker",
]
