"""``fencegate demo``: the zombie-worker scenario, end to end, as a timeline.

It can run any number of times, beside a running ``fencegate dev`` too: every
run has its own resource and idempotency keys, its own sinks on free ports,
and a key and configuration made up in memory (nothing under ``.fencegate/``
is written but the database's rows).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time

from gateway.client import FenceRejected, FenceToken, GatewayClient
from gateway.dev.stack import dev_stack
from leases import LeaseClient

FENCE_IN_ONE_LINE = ("A fence is the number the database hands out with each claim, higher "
                     "every time: the gateway accepts only a resource's newest.")
#: a shortened fence keeps at least this many digits
MIN_DIGITS = 6


def short_fences(*fences: int) -> list[str]:
    """Fences as a person compares them side by side: the leading digits they
    all share are left out (``…``), the rest grouped by threes.

    >>> short_fences(1764496512345678, 1764496514012345)
    ['…512 345 678', '…514 012 345']
    """
    texts = [str(f) for f in fences]
    if len({len(t) for t in texts}) != 1:  # not the same length: compare them whole
        return [_grouped(t) for t in texts]
    shared = len(os.path.commonprefix(texts))  # noqa: RUF071 - digits, not paths
    keep = max(len(texts[0]) - shared, MIN_DIGITS)
    # round up to whole groups of three, so "…512 345 678" never starts mid-group
    keep = min(len(texts[0]), -(-keep // 3) * 3)
    return [("…" if keep < len(t) else "") + _grouped(t[-keep:]) for t in texts]


def _grouped(digits: str) -> str:
    head = len(digits) % 3
    groups = ([digits[:head]] if head else []) + [digits[i:i + 3]
                                                  for i in range(head, len(digits), 3)]
    return " ".join(groups)


async def run_demo() -> int:
    """The zombie-worker scenario, end to end, as a timeline."""
    async with dev_stack(gateway_port=0, own_files=False) as stack:
        t0 = time.monotonic()

        def say(who: str, what: str) -> None:
            print(f"  t={time.monotonic() - t0:5.2f}s  {who:<9} {what}", flush=True)

        run = secrets.token_hex(3)
        resource, key = f"run:demo-{run}", f"quote-{run}"
        email = {"sender": "agent@example.com", "to": ["lead@example.com"],
                 "subject": "Your quote", "text": "Here is your quote."}
        print(f"\nThe zombie worker, on {resource}.\n{FENCE_IN_ONE_LINE}\n")
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
            fence_a, fence_b = short_fences(lease_a.fence, lease_b.fence)
            say("worker-b", f"claims {resource}: fence {lease_b.fence}")
            say("", f"fences, last digits: worker-a {fence_a} < worker-b {fence_b}")
            await gw.send_email(lease_b, key, **email)  # type: ignore[arg-type]
            say("worker-b", f"sends the quote email (key {key}) under fence {fence_b}: 200 sent")
            say("worker-a", f"wakes up, still believing it owns the run, and sends under "
                f"fence {fence_a}")
            zombie = FenceToken(lease_a.resource, lease_a.fence)  # checks nothing itself
            try:
                await gw.send_email(zombie, f"{key}-a", **email)  # type: ignore[arg-type]
                say("gateway", "LET IT THROUGH (this is a bug)")
                return 1
            except FenceRejected as exc:
                say("gateway", f"refuses worker-a: {exc.status} {exc.code} ({fence_a} is "
                    f"below the current fence {fence_b}); nothing was sent")
            again = await gw.send_email(lease_b, key, **email)  # type: ignore[arg-type]
            say("worker-b", f"retries {key} after a timeout: replayed={again.replayed}, "
                "nothing resent")
        await asyncio.sleep(0.1)
        got = len(stack.smtp.deliveries)
        print(f"\nThe SMTP sink received {got} message(s): "
              + ("the lead got the quote once.\n" if got == 1 else "that is wrong.\n"))
        return 0 if got == 1 else 1
