"""Room for requests in one gateway process, and when a request takes it.

``max_requests_in_flight`` bounds the requests doing work at once (the
database, a provider). A request that sends a body takes its slot once the
body has arrived, not when its headers have: a client holding bodies back
would otherwise hold every slot, and every other client's requests would
answer 503 ``overloaded`` until the body deadline cut them (issue 22). The
wait for a body is bounded by ``body_timeout_seconds`` and its size by the
route's limit; the bodies one client may be sending at once are bounded by
``max_requests_in_flight`` too, so one client cannot make the process hold
an unbounded number of them. Requests without a body take their slot at once.

    request ─▶ authenticated ─▶ body read (deadline, limit, the client's count)
            ─▶ slot taken (or 503 overloaded) ─▶ work ─▶ slot freed
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.api.problems import Problem
from gateway.metrics import IN_FLIGHT, REQUESTS_REFUSED
from gateway.state import GATEWAY
from gateway.wire import RETRY_AFTER


@dataclass
class Slot:
    """Whether this request holds one of the process's slots."""

    taken: bool = False


SLOT = web.RequestKey("slot", Slot)


def overloaded(limit: int, what: str) -> Problem:
    REQUESTS_REFUSED.labels(reason="in_flight").inc()
    return Problem("overloaded", f"the gateway is at its limit of {limit} {what} at "
                   "once; nothing was sent, retry later", headers={RETRY_AFTER: "1"})


def take(request: web.Request) -> None:
    """Take this request's slot (once), or 503 overloaded: past
    ``max_requests_in_flight``, refused at once rather than queued."""
    slot = request.get(SLOT)
    if slot is None or slot.taken:
        return
    gw = request.app[GATEWAY]
    limit = gw.config.max_requests_in_flight
    if gw.in_flight >= limit:
        raise overloaded(limit, "requests")
    gw.in_flight += 1
    IN_FLIGHT.inc()
    slot.taken = True


def release(request: web.Request) -> None:
    slot = request.get(SLOT)
    if slot is not None and slot.taken:
        slot.taken = False
        gw = request.app[GATEWAY]
        gw.in_flight -= 1
        IN_FLIGHT.dec()
