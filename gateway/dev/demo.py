"""``fencegate demo``: the zombie-worker scenario, end to end, as a timeline."""

from __future__ import annotations

import asyncio
import secrets
import time

from leases import LeaseClient

from ..client import FenceRejected, FenceToken, GatewayClient
from .stack import dev_stack


async def run_demo() -> int:
    """The zombie-worker scenario, end to end, as a timeline."""
    async with dev_stack(gateway_port=0) as stack:
        t0 = time.monotonic()

        def say(who: str, what: str) -> None:
            print(f"  t={time.monotonic() - t0:5.2f}s  {who:<9} {what}", flush=True)

        resource = f"run:demo-{secrets.token_hex(3)}"
        email = {"sender": "agent@example.com", "to": ["lead@example.com"],
                 "subject": "Your quote", "text": "Here is your quote."}
        print(f"\nThe zombie worker, on {resource}:\n")
        async with LeaseClient(stack.dsn, owner="worker-a") as a, \
                LeaseClient(stack.dsn, owner="worker-b") as b, \
                GatewayClient(stack.url, stack.api_key) as gw:
            lease_a = await a.claim(resource, ttl=1.0)
            assert lease_a is not None
            say("worker-a", f"claims {resource}: fence {lease_a.fence}, ttl 1s")
            say("worker-a", "starts preparing the quote email ... and stalls (GC pause, "
                "lost network)")
            await asyncio.sleep(1.5)
            say("database", "worker-a's lease has expired")
            lease_b = await b.claim(resource, ttl=30)
            assert lease_b is not None
            say("worker-b", f"claims {resource}: fence {lease_b.fence}")
            await gw.send_email(lease_b, "quote-42", **email)  # type: ignore[arg-type]
            say("worker-b", "sends the quote email (key quote-42): 200 sent")
            say("worker-a", "wakes up, still believing it owns the run, and sends")
            zombie = FenceToken(lease_a.resource, lease_a.fence)  # checks nothing itself
            try:
                await gw.send_email(zombie, "quote-42-a", **email)  # type: ignore[arg-type]
                say("gateway", "LET IT THROUGH (this is a bug)")
                return 1
            except FenceRejected as exc:
                say("gateway", f"refuses: {exc.status} {exc.code} (current fence "
                    f"{exc.current_fence})")
            again = await gw.send_email(lease_b, "quote-42", **email)  # type: ignore[arg-type]
            say("worker-b", f"retries quote-42 after a timeout: replayed={again.replayed}, "
                "nothing resent")
        await asyncio.sleep(0.1)
        print(f"\nThe SMTP sink received {len(stack.smtp.deliveries)} message(s): "
              "the lead got the quote once.\n")
        return 0 if len(stack.smtp.deliveries) == 1 else 1
