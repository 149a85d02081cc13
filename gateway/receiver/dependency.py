"""The receiver's check as a Starlette/FastAPI dependency::

    fenced = FencedDelivery(verifier)

    @app.post("/hook")
    async def hook(delivery: Delivery = Depends(fenced)) -> ...

In a plain Starlette endpoint, ``delivery = await fenced(request)``. A
refusal is an ``HTTPException`` with the refusal's status and its check in
the detail, which both frameworks answer without a traceback.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request

from gateway.receiver.verify import Delivery, Refused, Verifier

__all__ = ["FencedDelivery"]


class FencedDelivery:
    """A dependency answering the request's checked ``Delivery``.
    ``admit=False`` checks the signatures only (then ``verifier.admit`` in
    the endpoint's transaction)."""

    def __init__(self, verifier: Verifier, *, admit: bool = True) -> None:
        if admit and verifier.fences is None:
            raise ValueError("FencedDelivery(admit=True) needs a Verifier with a FenceStore")
        self.verifier = verifier
        self.admit = admit

    async def __call__(self, request: Request) -> Delivery:
        try:
            delivery = self.verifier.authenticate(request.headers, await request.body())
            if self.admit:
                await self.verifier.admit(delivery)
        except Refused as refused:
            raise HTTPException(refused.status, f"{refused.check}: {refused.detail}") from None
        return delivery
