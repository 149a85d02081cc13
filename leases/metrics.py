"""Prometheus metrics of the lease client and the work queue (names fixed by the contract)."""

from __future__ import annotations

from prometheus_client import Counter

LEASE_CLAIMS = Counter(
    "fencegate_lease_claims_total", "Lease claims, by result.", ["result"]
)
LEASE_RENEWALS = Counter(
    "fencegate_lease_renewals_total", "Lease renewals, by result.", ["result"]
)
JOBS = Counter(
    "fencegate_jobs_total", "Work-queue events, by queue and event.", ["queue", "event"]
)
