"""The effect path: admit (fence + key, one round trip), send, record, answer.

    request ─▶ admission ─┬─ refused (412 fence, 409 in progress/unknown, 422 reuse)
                          ├─ replay of a finished effect (nothing sent)
                          └─ admitted ─▶ rate limit ─▶ provider ─▶ finish ─▶ answer

The drain barrier rests on one local deadline per attempt, taken before the
admission is sent: everything after it (the admission's answer, the wait for
a provider connection, the send) must end by then, and no send starts within
a margin of it. The database holds the attempt's place in the barrier until
its own deadline, computed from its clock when it admitted the attempt
(never earlier than our start) plus the same budget and a grace: so it
always outlasts ours, whatever the database's or the pool's delays.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from aiohttp import web

from leases import clock

from . import idempotency
from .deadline import Deadline
from .ledger import BARRIER_GRACE_SECONDS, Admission, FinalState, StoredAnswer, new_attempt
from .metrics import EFFECTS, FENCE_REJECTIONS, PROVIDER_DURATION
from .problems import Problem
from .providers import Outcome, Provider, ProviderCall, too_late
from .ratelimit import TokenBucket, retry_after_header
from .requests import FenceHeaders
from .state import Gateway

log = logging.getLogger("fencegate.effects")

FENCE_VERDICTS = {
    "stale_fence": "the fence is lower than the resource's current fence: another worker "
                   "holds the resource now",
    "lease_expired": "the fence is current but its lease expired or was released",
    "no_lease": "no lease was ever granted on this resource",
    "invalid_fence": "the fence is higher than any fence issued for this resource",
}

#: provider outcome → (ledger state, effects_total outcome)
_RECORDED: dict[str, tuple[FinalState, str]] = {
    "succeeded": ("succeeded", "succeeded"),
    "failed": ("failed", "failed"),
    "retryable": ("free", "provider_error"),
    "unknown": ("unknown", "unknown"),
}


@dataclass(frozen=True)
class Effect:
    """One effect request, checked and ready for admission."""

    client: str
    fence: FenceHeaders
    provider: Provider
    call: ProviderCall
    fingerprint: bytes


def make_effect(client: str, fence: FenceHeaders, provider: Provider, *, method: str,
                path: str, query: str, headers: dict[str, str], body: bytes,
                canonical: bytes, payload: object = None) -> Effect:
    call = ProviderCall(
        client=client, key=fence.key, derived_key=idempotency.derived_key(client, fence.key),
        resource=fence.resource, fence=fence.fence, method=method, path=path, query=query,
        headers=headers, body=body, payload=payload,
    )
    target = f"{path}?{query}" if query else path
    fp = idempotency.fingerprint(provider.config.name, method, target, canonical)
    return Effect(client, fence, provider, call, fp)


def _answer(status: int, headers: dict[str, str], body: bytes) -> web.Response:
    return web.Response(status=status, headers=headers, body=body)


def _refusal(effect: Effect, admission: Admission) -> web.Response:
    name = effect.provider.config.name
    verdict = admission.verdict
    if verdict in FENCE_VERDICTS:
        FENCE_REJECTIONS.labels(provider=name, reason=verdict).inc()
        problem = Problem(verdict, FENCE_VERDICTS[verdict])
        if verdict == "stale_fence":
            problem.extra["current_fence"] = admission.current_fence
        raise problem
    if verdict == "idempotency_key_reused":
        raise Problem("idempotency_key_reused",
                      "this Idempotency-Key was used with a different request")
    if verdict == "effect_in_progress":
        EFFECTS.labels(provider=name, outcome="in_progress").inc()
        raise Problem("effect_in_progress", "an attempt with this Idempotency-Key is in flight",
                      headers={"Retry-After": retry_after_header(admission.retry_after or 1)})
    if verdict == "effect_outcome_unknown":
        raise Problem("effect_outcome_unknown",
                      "an earlier attempt with this Idempotency-Key may or may not have reached "
                      "the provider; an operator must resolve it "
                      "(POST /v1/effects/{key}/resolve)")
    if verdict == "replay":
        EFFECTS.labels(provider=name, outcome="replayed").inc()
        headers = dict(admission.stored_headers or {})
        headers["Idempotent-Replayed"] = "true"
        body = admission.stored_body
        if body is None:  # resolved by an operator: there is no provider answer to replay
            body = b'{"status": "sent", "resolved_by_operator": true}'
            headers["Content-Type"] = "application/json"
        return _answer(admission.stored_status or 200, headers, body)
    raise AssertionError(f"unknown verdict {verdict!r}")


def _bucket(gw: Gateway, provider: Provider) -> TokenBucket:
    name = provider.config.name
    if name not in gw.buckets:
        rate = provider.config.rate_limit_per_second * gw.rate_share
        gw.buckets[name] = TokenBucket(rate=rate, burst=max(1.0, rate))
    return gw.buckets[name]


def budget_seconds(gw: Gateway, provider: Provider) -> float:
    """From the admission's sending to the end of the send: the database's
    answer (bounded by its timeout), then the provider's timeout."""
    return gw.config.server.database_timeout_seconds + provider.config.timeout_seconds


async def run(gw: Gateway, effect: Effect) -> web.Response:
    """Take one effect through admission, the provider and the ledger."""
    provider = effect.provider
    cfg = provider.config
    f = effect.fence
    started = time.monotonic()
    budget = budget_seconds(gw, provider)
    deadline = Deadline(clock.now() + budget)  # before the admission is sent
    attempt = new_attempt()
    try:
        admission = await gw.ledger.admit(
            effect.client, f.key, effect.fingerprint, f.resource, f.fence, cfg.name, attempt,
            budget + BARRIER_GRACE_SECONDS, cfg.retry_window_seconds,
        )
    except Problem:
        # no answer: the admission may have committed all the same
        gw.ledger.free_unsent(effect.client, f.key, attempt, f.resource)
        raise
    if admission.verdict != "admitted":
        _log(effect, admission.verdict, started)
        return _refusal(effect, admission)

    async def end(state: FinalState, answer: StoredAnswer | None, summary: str | None) -> None:
        await gw.ledger.finish(effect.client, f.key, attempt, f.resource, state, answer,
                               summary)

    wait = _bucket(gw, provider).take(time.monotonic())
    if wait > 0:
        await end("free", None, None)
        EFFECTS.labels(provider=cfg.name, outcome="rate_limited").inc()
        _log(effect, "rate_limited", started)
        raise Problem("rate_limited", f"provider {cfg.name!r} is at its configured rate",
                      headers={"Retry-After": retry_after_header(wait)})

    sent_at = time.monotonic()
    outcome: Outcome = too_late(cfg.name) if not deadline.can_start() else \
        await provider.send(effect.call, deadline)
    PROVIDER_DURATION.labels(provider=cfg.name).observe(time.monotonic() - sent_at)

    state, label = _RECORDED[outcome.kind]
    if outcome.code == "overloaded":
        label = "overloaded"
    stored = StoredAnswer(outcome.status, outcome.headers, outcome.body) \
        if outcome.kind in ("succeeded", "failed") else None
    await end(state, stored, outcome.summary)
    EFFECTS.labels(provider=cfg.name, outcome=label).inc()
    _log(effect, label, started, summary=outcome.summary)
    return _answer(outcome.status, outcome.headers, outcome.body)


def _log(effect: Effect, outcome: str, started: float, summary: str | None = None) -> None:
    log.info("effect", extra={
        "client": effect.client, "resource": effect.fence.resource, "fence": effect.fence.fence,
        "key": effect.fence.key, "provider": effect.provider.config.name, "outcome": outcome,
        "duration_ms": round((time.monotonic() - started) * 1000, 2),
        **({"provider_summary": summary} if summary else {}),
    })
