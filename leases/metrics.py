"""Prometheus metrics of the lease client and the work queue (names fixed by the contract)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LEASE_CLAIMS = Counter(
    "fencegate_lease_claims_total", "Lease claims, by result.", ["result"]
)
LEASE_RENEWALS = Counter(
    "fencegate_lease_renewals_total", "Lease renewals, by result.", ["result"]
)
JOBS = Counter(
    "fencegate_jobs_total", "Work-queue events, by queue and event.", ["queue", "event"]
)
AWAITING_PURGE = Gauge(
    "fencegate_rows_awaiting_purge",
    "Rows past their retention not yet purged (effects by the gateway, jobs by workers).",
    ["table"], multiprocess_mode="max",
)
