"""Prometheus metrics of the gateway (names and labels fixed by the contract).

Labels never carry resources, keys, addresses or owners.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

FENCE_REJECTIONS = Counter(
    "fencegate_fence_rejections_total",
    "Effects refused at the fence check, by provider and reason.",
    ["provider", "reason"],
)
EFFECTS = Counter(
    "fencegate_effects_total", "Effect requests, by provider and outcome.",
    ["provider", "outcome"],
)
HTTP_DURATION = Histogram(
    "fencegate_http_request_duration_seconds", "Gateway HTTP requests.",
    ["route", "method", "status"],
)
PROVIDER_DURATION = Histogram(
    "fencegate_provider_request_duration_seconds", "Calls to providers.", ["provider"],
)
DB_UNAVAILABLE = Counter(
    "fencegate_db_unavailable_total", "Requests refused because the database was unreachable.",
)
