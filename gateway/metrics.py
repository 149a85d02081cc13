"""Prometheus metrics of the gateway (names and labels fixed by the contract).

Labels never carry resources, keys, addresses or owners.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

from prometheus_client import Counter, Gauge, Histogram

from gateway.wire import EffectOutcome, FenceRefusal, RateLimitReason
from leases import metrics as lease_metrics

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
IN_FLIGHT = Gauge(
    "fencegate_requests_in_flight", "API requests being handled now (all processes).",
    multiprocess_mode="livesum",
)
REQUESTS_REFUSED = Counter(
    "fencegate_requests_refused_total",
    "API requests refused at once as overloaded, nothing sent: by what was full "
    "(in_flight: max_requests_in_flight; database_pool: no connection came free).",
    ["reason"],
)
PROVIDER_RESENDS = Counter(
    "fencegate_provider_resends_total",
    "Resends of an attempt whose outcome was unknown, to a provider that dedupes on our "
    "key, inside its window: by what each came to (answered, unknown, not_acted) or why "
    "none went out (stale_fence, lease_expired, no_lease, not_in_flight, outside_window, "
    "provider_paused, unavailable).",
    ["provider", "outcome"],
)
PROVIDER_PAUSED = Counter(
    "fencegate_provider_paused_seconds_total",
    "Seconds a provider was paused for every caller after it answered 429 (Retry-After, "
    "or its preset's reset header); rate() is the share of time it was paused.",
    ["provider"],
)
RECORDS_GIVEN_UP = Counter(
    "fencegate_effect_records_given_up_total",
    "Ends of attempts the gateway could not record (no answer, or refused, for "
    "RECORD_RETRY_SECONDS; or left at shutdown): their effects read in flight until their "
    "deadline, then unknown, never sent again. By the end given up (succeeded, failed, "
    "unknown, free).",
    ["state"],
)
RATE_LIMITED = Counter(
    "fencegate_rate_limited_total",
    "Effects refused 429 rate_limited, nothing sent and the key free: by provider and "
    "reason (configured_rate: rate_limit_per_second; provider_paused: the provider's own "
    "429 paused it, refused before admission).",
    ["provider", "reason"],
)

#: the label values the contract fixes
REJECTION_REASONS: tuple[FenceRefusal, ...] = get_args(FenceRefusal)
EFFECT_OUTCOMES: tuple[EffectOutcome, ...] = get_args(EffectOutcome)
#: what was full when a request was refused at once (``fencegate_requests_refused_total``)
REFUSAL_REASONS = ("in_flight", "database_pool")
RATE_LIMIT_REASONS: tuple[RateLimitReason, ...] = get_args(RateLimitReason)
#: the ``method`` label's values besides "other": a label is never taken from
#: the request as sent (aiohttp's pure-Python parser takes any token as a
#: method, and each would be a new series on the unauthenticated /metrics)
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    """The request duration's ``method`` label: a known method, else "other"."""
    return method if method in KNOWN_METHODS else "other"


def status_label(status: int) -> str:
    """The ``status`` label: an HTTP status code (100-599), else "other" (a
    provider's answer is passed through, whatever it says)."""
    return str(status) if 100 <= status <= 599 else "other"


def start_at_zero(providers: Iterable[str]) -> None:
    """Create every provider's rejection and outcome series at 0 when the
    process starts. Prometheus's ``increase()`` cannot see a counter's first
    step from "no series" to 1, so without this the first stale fence after a
    start would never raise an alert (deploy/prometheus/rules.yml)."""
    for provider in providers:
        for refusal in REJECTION_REASONS:
            FENCE_REJECTIONS.labels(provider=provider, reason=refusal)
        for outcome in EFFECT_OUTCOMES:
            EFFECTS.labels(provider=provider, outcome=outcome)
        PROVIDER_PAUSED.labels(provider=provider)
        for limit in RATE_LIMIT_REASONS:
            RATE_LIMITED.labels(provider=provider, reason=limit)
    for full in REFUSAL_REASONS:
        REQUESTS_REFUSED.labels(reason=full)
    lease_metrics.start_at_zero()
