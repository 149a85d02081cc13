"""One attempt on the wire, the same for a first send and a resend: the last
check of its deadline, the provider, the time it took, and the pause the
provider asked for (its 429), noted for every caller of this process."""

from __future__ import annotations

import logging
import time

from gateway.effects.deadline import Deadline
from gateway.metrics import PROVIDER_DURATION, PROVIDER_PAUSED
from gateway.providers import Outcome, Provider, ProviderCall, too_late
from gateway.state import Gateway

log = logging.getLogger("fencegate.effects")


async def send_once(gw: Gateway, provider: Provider, call: ProviderCall,
               deadline: Deadline) -> Outcome:
    """Send ``call`` once, by ``deadline`` (nothing starts within its margin)."""
    name = provider.config.name
    sent_at = time.monotonic()
    outcome = too_late(name) if not deadline.can_start() else \
        await provider.send(call, deadline)
    now = time.monotonic()
    PROVIDER_DURATION.labels(provider=name).observe(now - sent_at)
    if outcome.pause_seconds is not None:
        added = gw.pauses.pause(name, now, outcome.pause_seconds)
        PROVIDER_PAUSED.labels(provider=name).inc(added)
        if added:
            log.warning("provider %s answered 429: paused %.1f s for every caller", name,
                        outcome.pause_seconds, extra={"provider": name,
                                                      "pause_seconds": outcome.pause_seconds})
    return outcome
