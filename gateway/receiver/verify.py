"""The receiver's check of one request from the gateway: its signatures
(gateway/signing.py), then its fence against the highest seen (fences.py).

``Verifier.authenticate`` checks, in this order: the Standard Webhooks
headers are there, the timestamp is within the tolerance, one
``webhook-signature`` matches the body, ``Fence-Resource`` and
``Fence-Token`` are there, one ``Fence-Signature`` matches them. Only then
are the fence values trusted. ``Verifier.admit`` checks the fence against a
``FenceStore``; ``verify`` does both. Each refusal is a ``Refused`` naming
the check that failed, with a status to answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from gateway.receiver.fences import FenceStore
from gateway.signing import (
    FENCE_SIGNATURE,
    WEBHOOK_ID,
    WEBHOOK_SIGNATURE,
    WEBHOOK_TIMESTAMP,
    fence_content,
    matches,
    signing_key,
    webhook_content,
)
from gateway.wire import FENCE_RESOURCE, FENCE_TOKEN

__all__ = ["DEFAULT_TOLERANCE_SECONDS", "Check", "Delivery", "Refused", "Verifier"]

log = logging.getLogger("fencegate.receiver")

#: how far ``webhook-timestamp`` may be from the receiver's clock, either way
#: (what Standard Webhooks libraries use)
DEFAULT_TOLERANCE_SECONDS: Final = 300.0
_MAX_FENCE: Final = 2**63 - 1

Check = Literal["missing_signature", "stale_timestamp", "bad_signature", "missing_fence",
                "bad_fence_signature", "stale_fence", "unavailable"]
#: what each refusal answers: 401 and 412 the gateway records as failed for
#: good; 503 (the receiver could not check: nothing done) frees the key
STATUSES: Final[dict[Check, tuple[int, str]]] = {
    "missing_signature": (401, "The request is not signed"),
    "stale_timestamp": (401, "The signature's timestamp is outside the tolerance"),
    "bad_signature": (401, "No signature matches the request"),
    "missing_fence": (400, "The fence headers are missing or malformed"),
    "bad_fence_signature": (401, "No fence signature matches the fence headers"),
    "stale_fence": (412, "A newer fence has reached this receiver"),
    "unavailable": (503, "The receiver cannot check the fence now"),
}


class Refused(Exception):
    """A request the receiver refuses: ``check`` names what failed."""

    def __init__(self, check: Check, detail: str, **extra: object) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.status, self.title = STATUSES[check]
        self.detail = detail
        self.extra = extra

    def document(self) -> dict[str, Any]:
        """An RFC 9457 problem document of the refusal."""
        return {"type": "about:blank", "title": self.title, "status": self.status,
                "detail": self.detail, "code": self.check, **self.extra}


@dataclass(frozen=True)
class Delivery:
    """A request whose signatures matched: every field here was signed."""

    msg_id: str
    timestamp: int
    resource: str
    fence: int
    body: bytes


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """The one value of ``name`` (any letter case). Two copies are refused:
    the signature checks one, and the receiver's code might read the other."""
    if hasattr(headers, "getall"):  # aiohttp's CIMultiDict
        values = list(headers.getall(name, []))
    elif hasattr(headers, "getlist"):  # Starlette's Headers
        values = list(headers.getlist(name))
    else:
        values = [v for k, v in headers.items() if k.lower() == name.lower()]
    if len(values) > 1:
        check: Check = ("missing_signature" if name.startswith("webhook")
                        else "bad_fence_signature" if name == FENCE_SIGNATURE
                        else "missing_fence")
        raise Refused(check, f"{name} is sent {len(values)} times")
    return values[0] if values else None


class Verifier:
    """Checks requests signed by the gateway with one of ``secrets`` (the
    provider's ``signing_secret_env`` value, ``whsec_`` optional; several
    while a secret is rotated), and their fences against ``fences`` (None:
    every ``admit`` names its store, e.g. one on the handler's connection)."""

    def __init__(self, secrets: str | Sequence[str], fences: FenceStore | None = None, *,
                 tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        secrets = [secrets] if isinstance(secrets, str) else list(secrets)
        if not secrets:
            raise ValueError("a Verifier needs at least one signing secret")
        self._keys = [signing_key(s) for s in secrets]
        self.fences = fences
        self.tolerance_seconds = tolerance_seconds
        self.clock = clock

    def authenticate(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        """The request's signed facts, or ``Refused``. No I/O."""
        msg_id, ts, sig = (_header(headers, n) for n in (WEBHOOK_ID, WEBHOOK_TIMESTAMP,
                                                         WEBHOOK_SIGNATURE))
        if not msg_id or not ts or not sig:
            missing = [n for n, v in ((WEBHOOK_ID, msg_id), (WEBHOOK_TIMESTAMP, ts),
                                      (WEBHOOK_SIGNATURE, sig)) if not v]
            raise Refused("missing_signature", f"no {', '.join(missing)} header")
        timestamp = self._timestamp(ts)
        if not matches(sig, self._keys, webhook_content(msg_id, ts, body)):
            raise Refused("bad_signature", "no v1 signature in webhook-signature matches the "
                          "body under this receiver's secrets")
        resource, token = _header(headers, FENCE_RESOURCE), _header(headers, FENCE_TOKEN)
        if not resource or not token:
            raise Refused("missing_fence", f"both {FENCE_RESOURCE} and {FENCE_TOKEN} are "
                          "needed")
        fence_sig = _header(headers, FENCE_SIGNATURE)
        if not fence_sig or not matches(fence_sig, self._keys,
                                        fence_content(msg_id, ts, resource, token, body)):
            raise Refused("bad_fence_signature", f"{FENCE_SIGNATURE} is missing or does not "
                          f"cover these {FENCE_RESOURCE} and {FENCE_TOKEN}: they are not "
                          "the gateway's")
        if not token.isdigit() or not 0 <= int(token) <= _MAX_FENCE:
            raise Refused("missing_fence", f"{FENCE_TOKEN} is not a decimal fence")
        return Delivery(msg_id, timestamp, resource, int(token), body)

    def _timestamp(self, ts: str) -> int:
        if not ts.isdigit():
            raise Refused("stale_timestamp", "webhook-timestamp is not in Unix seconds")
        off = int(ts) - self.clock()
        if abs(off) > self.tolerance_seconds:
            when = "old" if off < 0 else "far in the future"
            raise Refused("stale_timestamp", f"webhook-timestamp is {abs(off):.0f} s {when} "
                          f"(tolerance {self.tolerance_seconds:.0f} s)")
        return int(ts)

    async def admit(self, delivery: Delivery, fences: FenceStore | None = None) -> None:
        """Check the delivery's fence against ``fences`` (by default the
        verifier's own): ``Refused`` ``stale_fence`` if a newer one was seen.
        ``PostgresFences(conn)`` runs it in the receiver's transaction."""
        store = fences if fences is not None else self.fences
        if store is None:
            raise TypeError("admit needs a FenceStore: the Verifier was built without one")
        try:
            highest = await store.advance(delivery.resource, delivery.fence)
        except Exception as e:  # the store's failure is the receiver's, not the sender's
            log.exception("fence store failed for %s", delivery.resource)
            raise Refused("unavailable", "the fence could not be checked; nothing was "
                          "done, send it again") from e
        if highest > delivery.fence:
            raise Refused("stale_fence", f"fence {delivery.fence} of {delivery.resource} is "
                          f"older than {highest}, the newest this receiver has seen",
                          resource=delivery.resource, fence=delivery.fence,
                          current_fence=highest)

    async def verify(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        """``authenticate``, then ``admit`` against the verifier's store."""
        delivery = self.authenticate(headers, body)
        await self.admit(delivery)
        return delivery
