"""The effect path: admit (fence + key, one round trip), send, record, answer.

    request ─▶ provider paused? ─▶ admission ─┬─ refused (412 fence, 409, 422 reuse)
               (429, or a short wait)            ├─ replay of a finished effect
                                                 └─ admitted ─▶ rate limit ─▶ provider
                        ─▶ (unknown, and the provider dedupes: resend.py) ─▶ finish ─▶ answer

The drain barrier rests on one local deadline per attempt, taken before the
admission is sent: everything after it (the admission's answer, the wait for
a provider connection, the send) must end by then, and no send starts within
a margin of it. The database holds the attempt's place in the barrier until
its own deadline, computed from its clock when it admitted the attempt
(never earlier than our start) plus the same budget and a grace: so it
always outlasts ours, whatever the database's or the pool's delays.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import NoReturn

from aiohttp import web

from gateway.api.email_body import EmailRequest
from gateway.api.parsing import EffectHeaders
from gateway.api.problems import PROBLEM_MEMBERS, Problem
from gateway.effects import fingerprint, resend, summary
from gateway.effects.attempt import send_once
from gateway.effects.deadline import Deadline
from gateway.effects.pace import PACE_WAIT_SECONDS
from gateway.effects.ratelimit import TokenBucket, retry_after_header
from gateway.ledger import Admission, StoredAnswer, new_attempt
from gateway.metrics import EFFECTS, FENCE_REJECTIONS, RATE_LIMITED
from gateway.providers import EmailCall, HttpCall, Outcome, Provider, ProviderCall
from gateway.providers.mime import Unbuildable, build_message
from gateway.state import Gateway
from gateway.wire import (
    FENCE_REFUSALS,
    IDEMPOTENT_REPLAYED,
    RETRY_AFTER,
    EffectOutcome,
    Finished,
    ProblemCode,
    Refusal,
)
from leases import clock

log = logging.getLogger("fencegate.effects")


#: the detail of each refusal the admission answers
REFUSALS: dict[Refusal, str] = {
    "stale_fence": "the fence is lower than the resource's current fence: another worker "
                   "holds the resource now",
    "lease_expired": "the fence is current but its lease expired or was released",
    "no_lease": "no lease was ever granted on this resource",
    "invalid_fence": "the fence is higher than any fence issued for this resource",
    "idempotency_key_reused": "this Idempotency-Key was used with a different request",
    "effect_in_progress": "an attempt with this Idempotency-Key is in flight",
    "effect_outcome_unknown": "an earlier attempt with this Idempotency-Key may or may not "
                              "have reached the provider; an operator must resolve it "
                              "(POST /v1/effects/{key}/resolve)",
}

@dataclass(frozen=True)
class Effect:
    """One effect request, checked and ready for admission: the provider, the
    call it would make, the request's fingerprint (what a repeat of the key
    must match), and the request in brief, as JSON text (effects/summary.py:
    what the ledger keeps of it for operators, stored when the key is first
    admitted)."""

    provider: Provider
    call: ProviderCall
    fingerprint: bytes
    request_summary: str | None = None

    @property
    def retry_window_seconds(self) -> float:
        """How long the provider dedupes this request on our key (0: it does
        not): the provider's window, unless its preset says this endpoint
        ignores the key. An email goes to the email endpoint, which dedupes
        wherever the preset has a window."""
        call = self.call
        if isinstance(call, HttpCall):
            return self.provider.config.retry_window_for(call.method, call.path)
        return self.provider.config.retry_window_seconds

    @classmethod
    def http(cls, client: str, headers: EffectHeaders, provider: Provider, *, method: str,
             path: str, query: str, forwarded: dict[str, str], body: bytes,
             content_type: str | None) -> Effect:
        call = HttpCall(client, headers.key, headers.resource, headers.fence, method=method,
                        path=path, query=query, headers=forwarded, body=body)
        target = f"{path}?{query}" if query else path
        return cls(provider, call, fingerprint.fingerprint(
            provider.config.name, method, target,
            fingerprint.canonical_body(body, content_type)),
            _json(summary.http_summary(call, content_type)))

    @classmethod
    def email(cls, client: str, headers: EffectHeaders, provider: Provider,
              email: EmailRequest, raw_body: bytes) -> Effect:
        call = EmailCall(client, headers.key, headers.resource, headers.fence, email=email)
        # built (and read back) before the admission: an email the provider
        # could not be given is a 400 with nothing reserved, never a 500 with
        # the key left unknown and the resource behind the drain barrier
        try:
            call = replace(call, message=build_message(call, provider.config.idempotency_header))
        except Unbuildable as e:
            raise Problem("bad_request", f"the email cannot be sent as given: {e}") from None
        # An HTTP provider also takes /v1/http/{provider}/email: an email is
        # fingerprinted under a path no proxied request can have (they never
        # start with "/"), so a repeat of the key on the other route is a
        # different request (422), not this one.
        return cls(provider, call, fingerprint.fingerprint(
            provider.config.name, "POST", "/v1/email",
            fingerprint.canonical_body(raw_body, "application/json")),
            _json(summary.email_summary(call)))


def _json(value: dict[str, object]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _refuse(effect: Effect, admission: Admission, verdict: Refusal) -> NoReturn:
    """The admission refused: the fence, or the key. Counted, then answered."""
    name = effect.provider.config.name
    headers: dict[str, str] = {}
    extra: dict[str, object] = {}
    if verdict in FENCE_REFUSALS:
        FENCE_REJECTIONS.labels(provider=name, reason=verdict).inc()
        if verdict == "stale_fence":
            extra["current_fence"] = admission.current_fence
    elif verdict == "effect_in_progress":
        EFFECTS.labels(provider=name, outcome="in_progress").inc()
        headers[RETRY_AFTER] = retry_after_header(admission.retry_after or 1)
    raise Problem(verdict, REFUSALS[verdict], headers=headers, **extra)


def _replay(effect: Effect, admission: Admission) -> web.Response:
    """A finished effect: its stored answer again, nothing sent."""
    EFFECTS.labels(provider=effect.provider.config.name, outcome="replayed").inc()
    headers = dict(admission.stored_headers or {})
    headers[IDEMPOTENT_REPLAYED] = "true"
    body = admission.stored_body
    if body is None:  # resolved by an operator: there is no provider answer to replay
        body = b'{"status": "sent", "resolved_by_operator": true}'
        headers["Content-Type"] = "application/json"
    return web.Response(status=admission.stored_status or 200, headers=headers, body=body)


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


async def _mind_the_pause(gw: Gateway, effect: Effect, started: float) -> None:
    """A provider that answered 429 is paused for every caller: a pause of up
    to ``PACE_WAIT_SECONDS`` is waited out; a longer one is refused before the
    admission, so nothing is reserved and the key stays free."""
    name = effect.provider.config.name
    while (left := gw.pauses.remaining(name, time.monotonic())) > 0:
        if left > PACE_WAIT_SECONDS:
            EFFECTS.labels(provider=name, outcome="rate_limited").inc()
            RATE_LIMITED.labels(provider=name, reason="provider_paused").inc()
            _log(effect, "rate_limited", started, summary="provider paused")
            raise Problem("rate_limited", f"provider {name!r} asked for a pause (it answered "
                          f"429); {left:.1f} s are left: nothing was sent, and the key "
                          "is as it was (a repeat after the pause gets what it would have "
                          "got)",
                          headers={RETRY_AFTER: retry_after_header(left)},
                          reason="provider_paused")
        await asyncio.sleep(left)


async def run_effect(gw: Gateway, effect: Effect) -> web.Response:
    """Take one effect through admission, the provider and the ledger."""
    provider, call = effect.provider, effect.call
    cfg = provider.config
    started = time.monotonic()
    if gw.ledger.outcomes.pending(call.client, call.key) is not None:
        # this process answered the key a moment ago and is still writing its
        # record: the admission must see it (a replay, or unknown), not "in
        # progress". Waited for before the pause and the deadline.
        await gw.ledger.settled(call.client, call.key)
    await _mind_the_pause(gw, effect, started)
    budget = budget_seconds(gw, provider)
    deadline = Deadline(clock.now() + budget)  # before the admission is sent
    attempt = new_attempt()
    admission = await gw.ledger.admit(
        call.client, call.key, effect.fingerprint, call.resource, call.fence, cfg.name,
        attempt, budget + gw.config.server.barrier_grace_seconds, effect.retry_window_seconds,
        request_summary=effect.request_summary,
    )
    verdict = admission.verdict
    if verdict != "admitted":
        _log(effect, verdict, started)
        if verdict == "replay":
            return _replay(effect, admission)
        if verdict == "abandoned" or verdict == "busy":  # a nonce collision, a late statement
            raise Problem("unavailable", "the attempt could not be admitted; nothing was sent",
                          headers={RETRY_AFTER: "1"})
        if verdict in FENCE_REFUSALS and gw.rejections is not None:  # for the console
            gw.rejections.note(call.client, cfg.name, verdict, call.resource, call.fence,
                               admission.current_fence, call.key)
        _refuse(effect, admission, verdict)

    async def free() -> Finished | None:
        return await gw.ledger.free(call.client, call.key, attempt, call.resource)

    wait = _bucket(gw, provider).take(time.monotonic())
    if wait > 0:
        freed = await free()
        EFFECTS.labels(provider=cfg.name, outcome="rate_limited").inc()
        RATE_LIMITED.labels(provider=cfg.name, reason="configured_rate").inc()
        _log(effect, "rate_limited", started)
        raise _at_configured_rate(cfg.name, wait, freed)

    outcome = await send_once(gw, provider, call, deadline)
    if outcome.kind == "unknown" and effect.retry_window_seconds > 0 and \
            resend.resendable(cfg):
        outcome = await resend.resend(gw, provider, call, attempt, outcome, budget)

    label = _counted_as(outcome)
    if outcome.kind == "free":  # awaited: a retry right after the answer finds the key free
        freed = await free()
        if freed != "free":
            outcome = _not_freed(outcome, freed)
    else:  # behind the answer
        stored = StoredAnswer(outcome.status, outcome.headers, outcome.body) \
            if outcome.kind in ("succeeded", "failed") else None
        gw.ledger.finish(call.client, call.key, attempt, call.resource, outcome.kind, stored,
                         outcome.summary, never_whole=outcome.request_never_whole)
    EFFECTS.labels(provider=cfg.name, outcome=label).inc()
    _log(effect, label, started, summary=outcome.summary)
    return web.Response(status=outcome.status, headers=outcome.headers, body=outcome.body)


def _counted_as(outcome: Outcome) -> EffectOutcome:
    """The ``fencegate_effects_total`` label of what an attempt came to: its
    end, but a free one by why nothing was done."""
    if outcome.kind == "free":
        return "overloaded" if outcome.code == "overloaded" else "provider_error"
    return outcome.kind


def _at_configured_rate(provider: str, wait: float, freed: Finished | None) -> Problem:
    """The refusal of an effect over the provider's configured rate: 429, the
    key free again, unless its free did not free it."""
    detail = f"provider {provider!r} is at its configured rate; nothing was sent"
    if freed == "unknown":  # an earlier attempt may have acted: not a plain 429
        return Problem("provider_outcome_unknown", f"{detail}, but {_not_released(freed)}")
    return Problem("rate_limited",
                   detail if freed == "free" else f"{detail}, but {_not_released(freed)}",
                   headers={RETRY_AFTER: retry_after_header(wait)}, reason="configured_rate")


def _not_released(freed: Finished | None) -> str:
    """Why a key whose attempt did nothing is still not free."""
    if freed == "unknown":
        return ("an earlier attempt of this key may have reached the provider: the effect's "
                "outcome is unknown and the key is not released")
    if freed == "gone":
        return ("this attempt no longer holds the key (a newer attempt of it, or an "
                "operator's resolve, settles it): a repeat reads what that came to")
    return ("the gateway could not record that in time, so the key may not be released: a "
            "repeat may read in progress, then unknown, until an operator resolves it as "
            "not sent")


def _not_freed(outcome: Outcome, freed: Finished | None) -> Outcome:
    """This attempt did nothing, but the key was not freed: the answer keeps
    the provider's facts and no longer says the key is free; when an earlier
    attempt may have acted, its code says the outcome is unknown."""
    doc = json.loads(outcome.body)
    extra = {k: v for k, v in doc.items() if k not in PROBLEM_MEMBERS}
    code: ProblemCode = "provider_outcome_unknown" if freed == "unknown" else \
        outcome.code or "provider_error"
    p = Problem(code, f"{outcome.summary}: nothing was done, but {_not_released(freed)}",
                **extra)
    return replace(outcome, status=p.status, body=p.body(),
                   headers={**outcome.headers, **p.response_headers()})


def _log(effect: Effect, outcome: str, started: float, summary: str | None = None) -> None:
    """One line per effect request: who, under which fence, what came of it."""
    call = effect.call
    log.info("effect %s on %s under fence %s: %s", call.key, call.resource, call.fence,
             outcome, extra={
                 "client": call.client, "resource": call.resource, "fence": call.fence,
                 "key": call.key, "provider": effect.provider.config.name,
                 "outcome": outcome,
                 "duration_ms": round((time.monotonic() - started) * 1000, 2),
                 **({"provider_summary": summary} if summary else {}),
             })
