"""The receiving end of the gateway's HTTP effects: check that a request is
the gateway's (its Standard Webhooks signature and its fence signature) and
that its fence is not older than one already seen for its resource.

For a service that receives the gateway's requests; it needs none of the
gateway's server. ``Verifier`` is framework-neutral; ``fence_middleware``
(gateway/receiver/middleware.py) is the aiohttp middleware, and
``gateway.receiver.dependency`` the Starlette/FastAPI dependency (it
imports Starlette, so it is not imported here).

Refusals, each a ``Refused`` with its ``check``::

    Refused
      missing_signature, stale_timestamp, bad_signature   (401)
      missing_fence (400), bad_fence_signature (401)
      stale_fence (412), unavailable (503: the store failed)
"""

from gateway.receiver.fences import FenceStore, MemoryFences, PostgresFences
from gateway.receiver.middleware import DELIVERY, fence_middleware, refusal_response
from gateway.receiver.verify import Check, Delivery, Refused, Verifier

__all__ = [
    "DELIVERY",
    "Check",
    "Delivery",
    "FenceStore",
    "MemoryFences",
    "PostgresFences",
    "Refused",
    "Verifier",
    "fence_middleware",
    "refusal_response",
]
