"""What every provider offers the effect path.

A provider turns one call into one ``Outcome``, and must tell apart the four
endings, because the ledger treats them differently:

- ``succeeded``: the provider acted; the answer is stored and replayed.
- ``failed``: the provider refused for good; stored and replayed too.
- ``retryable``: the provider certainly did not act; the key is freed.
- ``unknown``: the provider may have acted (a timeout or a connection lost after
  the request left); never sent again unless the provider dedupes on our key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from ..config import ProviderConfig
from ..deadline import Deadline
from ..problems import Problem

OutcomeKind = Literal["succeeded", "failed", "retryable", "unknown"]


@dataclass(frozen=True)
class ProviderCall:
    """One attempt of one effect, as the provider needs it."""

    client: str
    key: str
    derived_key: str
    resource: str
    fence: int
    method: str = "POST"
    path: str = ""
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    payload: object = None  # the validated EmailRequest for smtp


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    status: int  # what the gateway answers the caller
    body: bytes
    headers: dict[str, str]
    summary: str  # one line for operators; never a secret or a message body
    code: str | None = None  # the problem code, when the answer is a gateway problem


class Provider(Protocol):
    config: ProviderConfig

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, call: ProviderCall, deadline: Deadline) -> Outcome:
        """Make the call, and answer by ``deadline``; start sending nothing
        once ``deadline.can_start()`` is false (answer ``too_late``)."""
        ...


def problem_outcome(kind: OutcomeKind, code: str, detail: str, summary: str,
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
                headers={"Retry-After": "1"})
    return Outcome("retryable", p.status, p.body(), p.response_headers(),
                   f"not sent: deadline reached waiting for {waiting_for}", "overloaded")
