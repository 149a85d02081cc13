"""Fenced leases on PostgreSQL: the lease manager, the lease client and the work queue."""

from .client import Lease, LeaseClient, LeaseInfo
from .errors import (
    Busy,
    InvalidArgument,
    LeaseLost,
    LeasesError,
    SchemaError,
    SchemaTooNew,
    Unavailable,
)
from .policy import RenewalPolicy
from .queue import Job, NewJob, Queue
from .retry import RetryDecision, RetryPolicy
from .worker import Worker

__all__ = [
    "Busy",
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
    "SchemaError",
    "SchemaTooNew",
    "Unavailable",
    "Worker",
]
