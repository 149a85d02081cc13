"""Prometheus metrics of the lease client and the work queue (names fixed by the contract)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

LEASE_CLAIMS = Counter(
    "fencegate_lease_claims_total", "Lease claims, by result.", ["result"]
)
LEASE_RENEWALS = Counter(
    "fencegate_lease_renewals_total", "Lease renewals, by result.", ["result"]
)
JOBS = Counter(
    "fencegate_jobs_total", "Work-queue events, by queue and event.", ["queue", "event"]
)
PERIODIC_TICKS = Counter(
    "fencegate_periodic_ticks_total",
    "Ticks of periodic schedules seen by a scheduler, by schedule and result: enqueued "
    "(this scheduler made the job), duplicate (another had), too_late (older than its "
    "catch_up: skipped).", ["schedule", "result"],
)
AWAITING_PURGE = Gauge(
    "fencegate_rows_awaiting_purge",
    "Rows past their retention not yet purged (effects by the gateway, jobs by workers).",
    ["table"], multiprocess_mode="max",
)

#: the label values the contract fixes
CLAIM_RESULTS = ("won", "held")
RENEWAL_RESULTS = ("ok", "lost")
PERIODIC_RESULTS = ("enqueued", "duplicate", "too_late")
JOB_EVENTS = ("enqueued", "deduplicated", "claimed", "completed", "retried", "dead",
              "replayed", "cancelled", "snoozed")


def start_at_zero(queues: Iterable[str] = ()) -> None:
    """Create the lease series, and every event series of ``queues``, at 0:
    Prometheus's ``increase()`` cannot see a counter's first step from "no
    series" to 1, so an alert on the first lost renewal or dead job after a
    process starts needs the series to exist before it happens."""
    for result in CLAIM_RESULTS:
        LEASE_CLAIMS.labels(result=result)
    for result in RENEWAL_RESULTS:
        LEASE_RENEWALS.labels(result=result)
    for queue in queues:
        for event in JOB_EVENTS:
            JOBS.labels(queue=queue, event=event)
POOL_WAIT = Histogram(
    "fencegate_db_pool_wait_seconds", "Waits for a database connection from the pool.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
POOL_BUSY = Counter(
    "fencegate_db_pool_busy_total",
    "Database calls given up because every connection of the pool stayed in use "
    "(an overloaded process, not an unreachable database).",
)
BATCH_SIZE = Histogram(
    "fencegate_db_batch_size",
    "Calls carried by one statement (group commit), by what they were.",
    ["statement"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
