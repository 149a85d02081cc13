"""What every provider offers the effect path.

A provider turns one call into one ``Outcome``, and must tell apart the four
ends of an attempt (``wire.AttemptEnd``), because the ledger records each as
it is said:

- ``succeeded``: the provider acted; the answer is stored and replayed.
- ``failed``: the provider refused for good; stored and replayed too.
- ``free``: the provider certainly did not act; the key is freed.
- ``unknown``: the provider may have acted (a timeout or a connection lost after
  the request left); never sent again unless the provider dedupes on our key.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.api.email_body import EmailRequest
from gateway.api.problems import Problem
from gateway.config import ProviderConfig
from gateway.effects.deadline import Deadline
from gateway.effects.fingerprint import derived_key
from gateway.wire import RETRY_AFTER, AttemptEnd, ProblemCode


@dataclass(frozen=True)
class Call:
    """What every attempt carries: who acts, for which key, under which fence."""

    client: str
    key: str
    resource: str
    fence: int

    @functools.cached_property
    def derived_key(self) -> str:
        """The key sent to the provider: the same for every attempt of one
        effect, different across clients."""
        return derived_key(self.client, self.key)


#: never forwarded from the caller: hop-by-hop, and the gateway's own
DROPPED_REQUEST_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "authorization", "cookie",
    "fence-resource", "fence-token", "idempotency-key", "accept-encoding", "expect",
    "webhook-id", "webhook-timestamp", "webhook-signature", "fence-signature", "forwarded",
    "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "via",
})


def caller_headers(lines: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The caller's header lines as one field each, under the name's first
    spelling, its lines' values joined by ", " (RFC 9110 5.3): a dict of
    the request's headers kept one line of a repeated field, so a header
    named only on a second Connection line was forwarded, and a repeated
    field reached the provider with its first value only."""
    fields: dict[str, str] = {}
    spelling: dict[str, str] = {}
    for name, value in lines:
        key = spelling.setdefault(name.lower(), name)
        fields[key] = f"{fields[key]}, {value}" if key in fields else value
    return fields


def forwarded_headers(caller: dict[str, str]) -> dict[str, str]:
    """The caller's headers that may reach the provider: none of
    ``DROPPED_REQUEST_HEADERS``, and none a Connection header names (hop by
    hop, RFC 9110 7.6.1), whatever the letter case of either."""
    connection_named = {
        h.strip().lower()
        for name, value in caller.items() if name.lower() == "connection"
        for h in value.split(",") if h.strip()
    }
    return {k: v for k, v in caller.items()
            if k.lower() not in DROPPED_REQUEST_HEADERS and k.lower() not in connection_named}


@dataclass(frozen=True)
class HttpCall(Call):
    """A request to forward to an HTTP provider."""

    method: str
    path: str  #: under the provider's base URL, still percent-encoded
    query: str  #: as the caller sent it, still percent-encoded
    headers: dict[str, str] = field(default_factory=dict)  #: the caller's, to filter
    body: bytes = b""

    @functools.cached_property
    def forwarded(self) -> dict[str, str]:
        """The caller's headers that may be forwarded (``forwarded_headers``),
        filtered once for the checks, the summary and the request."""
        return forwarded_headers(self.headers)


@dataclass(frozen=True)
class EmailCall(Call):
    """An email to send through an SMTP provider (or an email API)."""

    email: EmailRequest
    #: the MIME message, built and read back before the admission
    #: (``mime.build_message``), so what is sent is what was checked; empty
    #: for a call made without it, which the provider then builds
    message: bytes = b""


#: one attempt of one effect: a tagged union, one kind per provider kind
ProviderCall = HttpCall | EmailCall


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to (``kind``, the end the ledger records) and
    the answer the caller gets."""

    kind: AttemptEnd
    status: int  # what the gateway answers the caller
    body: bytes
    headers: dict[str, str]
    summary: str  # one line for operators; never a secret or a message body
    code: ProblemCode | None = None  # the problem code, when the answer is a gateway problem
    #: the provider answered 429: how long it asked every caller to wait (gateway/effects/pace.py)
    pause_seconds: float | None = None
    #: an unknown outcome whose request certainly never left this host whole
    #: (its tail was dropped before the kernel had it): "not sent" is then safe
    #: once the attempt is over; otherwise the provider's host may hold it whole
    request_never_whole: bool = False


class Provider(Protocol):
    @property
    def config(self) -> ProviderConfig: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, call: ProviderCall, deadline: Deadline) -> Outcome:
        """Make the call, and answer by ``deadline``; start sending nothing
        once ``deadline.can_start()`` is false (answer ``too_late``)."""
        ...


def problem_outcome(kind: AttemptEnd, code: ProblemCode, detail: str, summary: str,
                    **extra: object) -> Outcome:
    """An Outcome whose answer to the caller is a problem document."""
    p = Problem(code, detail)
    p.extra.update(extra)
    return Outcome(kind, p.status, p.body(), p.response_headers(), summary, code)


def too_late(provider: str, waiting_for: str = "its turn") -> Outcome:
    """Nothing was sent: the attempt's deadline came too close while it waited
    (for a provider connection, or the process was paused). The key is free."""
    p = Problem("overloaded", f"the gateway could not start sending to {provider!r} in time "
                f"(it waited for {waiting_for}); nothing was sent, retry later",
                headers={RETRY_AFTER: "1"})
    return Outcome("free", p.status, p.body(), p.response_headers(),
                   f"not sent: deadline reached waiting for {waiting_for}", "overloaded")
