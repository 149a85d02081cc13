"""Safe resends inside a provider's idempotency window, within the request.

An attempt whose outcome is unknown (no answer in time, the connection lost
after the request left, a 500/502/504 or a status the preset calls unknown)
to an HTTP provider that dedupes on our key is sent again, with the same
provider key, so the caller gets the provider's definite answer rather than
504 ``provider_timeout``:

    unknown ─▶ backoff (jittered) ─▶ extend in the ledger ─┬─ refused: unknown, as before
                                                           └─ extended ─▶ send again

The ledger extends the attempt first (``fencegate_extend_effect``): one
statement, under the lease row's lock, that only succeeds while the fence is
current and its lease live, the attempt still in flight under its nonce, and
the provider's window, counted from the first admission, still covers the
whole new attempt with a margin (``ledger.RESEND_MARGIN_SECONDS``). It moves
the attempt's deadline and its lease's drain barrier together, so no claim
can be granted while the resend may still land. The new local deadline is
taken before that statement is sent, as for an admission: the resend goes
out only while it holds. A refusal keeps today's answer (unknown, never
resent); so do a provider without idempotency, a window that is too short,
and SMTP, which never resends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

from gateway.config import HttpProviderConfig, ProviderConfig, ServerConfig
from gateway.effects.attempt import send_once
from gateway.effects.deadline import Deadline
from gateway.effects.pace import PACE_WAIT_SECONDS
from gateway.metrics import PROVIDER_RESENDS
from gateway.providers import Outcome, Provider, ProviderCall
from gateway.state import Gateway
from gateway.wire import ExtendVerdict, ResendOutcome
from leases import Busy, Unavailable, clock
from leases.retry import RetryPolicy

log = logging.getLogger("fencegate.effects")

#: backoff before resend n: between half and all of base * 2^(n-1), capped
RESEND_BACKOFF_BASE_SECONDS = 0.5
RESEND_BACKOFF_CAP_SECONDS = 2.0


def resendable(config: ProviderConfig) -> bool:
    """Whether an unknown outcome of this provider is sent again within the
    request: an HTTP provider that dedupes on our key, for a window."""
    return isinstance(config, HttpProviderConfig) and config.retry_window_seconds > 0 \
        and config.resend_attempts > 0


def longest_effect_seconds(server: ServerConfig, config: ProviderConfig) -> float:
    """From an effect's admission to its answer, at most: the budget of every
    attempt (the first and each resend), and the longest backoff before each
    resend."""
    resends = config.resend_attempts \
        if isinstance(config, HttpProviderConfig) and resendable(config) else 0
    budget = server.database_timeout_seconds + config.timeout_seconds
    backoffs = sum(min(RESEND_BACKOFF_CAP_SECONDS, RESEND_BACKOFF_BASE_SECONDS * 2.0 ** (n - 1))
                   for n in range(1, resends + 1))
    return (1 + resends) * budget + backoffs


def policy(config: HttpProviderConfig) -> RetryPolicy:
    return RetryPolicy(max_attempts=config.resend_attempts + 1,
                       base_seconds=RESEND_BACKOFF_BASE_SECONDS,
                       cap_seconds=RESEND_BACKOFF_CAP_SECONDS)


async def resend(gw: Gateway, provider: Provider, call: ProviderCall, attempt: int,
                 unknown: Outcome, budget: float) -> Outcome:
    """Send attempt ``attempt`` again while the ledger allows it, up to the
    provider's ``resend_attempts``; the first definite answer, or the last
    unknown outcome. A resend the provider refused without acting (a 503, a
    429) tells nothing of the first attempt: it never turns the effect free."""
    config = provider.config
    assert isinstance(config, HttpProviderConfig)
    backoff = policy(config)
    for n in range(1, config.resend_attempts + 1):
        await asyncio.sleep(backoff.backoff(n, gw.rng))
        paused = gw.pauses.remaining(config.name, time.monotonic())
        if paused > PACE_WAIT_SECONDS:
            _count(call, config.name, n, "provider_paused")
            return unknown
        if paused:
            await asyncio.sleep(paused)
        if gw.before_resend is not None:
            await gw.before_resend(call)
        deadline = Deadline(clock.now() + budget)  # before the extension is sent
        verdict = await _extend(gw, call, attempt, budget)
        if verdict != "extended":
            _count(call, config.name, n, verdict)
            return unknown
        outcome = await send_once(gw, provider, call, deadline)
        _count(call, config.name, n, _counted_as(outcome))
        if outcome.kind in ("succeeded", "failed"):
            return outcome
        if outcome.kind == "unknown":
            unknown = outcome
    return unknown


def _counted_as(outcome: Outcome) -> ResendOutcome:
    """The ``fencegate_provider_resends_total`` label of what a resend came to."""
    if outcome.kind == "free":
        return "not_acted"
    if outcome.kind == "unknown":
        return "unknown"
    return "answered"


async def _extend(gw: Gateway, call: ProviderCall, attempt: int,
                  budget: float) -> ExtendVerdict | Literal["unavailable"]:
    try:
        return await gw.ledger.extend(call.client, call.key, attempt, call.resource,
                                      call.fence,
                                      budget + gw.config.server.barrier_grace_seconds)
    except (Unavailable, Busy):  # it may have committed: a later deadline, nothing sent
        return "unavailable"


def _count(call: ProviderCall, provider: str, n: int, outcome: ResendOutcome) -> None:
    PROVIDER_RESENDS.labels(provider=provider, outcome=outcome).inc()
    log.info("effect %s on %s under fence %s: resend %d: %s", call.key, call.resource,
             call.fence, n, outcome, extra={
                 "client": call.client, "resource": call.resource, "fence": call.fence,
                 "key": call.key, "provider": provider, "resend": n, "outcome": outcome})
