"""Fenced leases on PostgreSQL: the lease manager, the lease client and the work queue."""

from .client import Lease, LeaseClient, LeaseInfo
from .errors import InvalidArgument, LeaseLost, LeasesError, SchemaError, SchemaTooNew
from .policy import RenewalPolicy

__all__ = [
    "InvalidArgument",
    "Lease",
    "LeaseClient",
    "LeaseInfo",
    "LeaseLost",
    "LeasesError",
    "RenewalPolicy",
    "SchemaError",
    "SchemaTooNew",
]
