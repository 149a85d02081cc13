"""``fencegate demo queue``: the job platform's scenario as a timeline.

A charge enqueued, the same charge delivered again (deduplicated: charged
once), a flaky job that retries on its own, a poison job that goes to the
dead letters, then the fix and a replay. Like ``fencegate demo``, it runs any
number of times, beside a running ``fencegate dev`` too: its own queue, its
own sinks on free ports, a key made up in memory.
"""

from __future__ import annotations

import asyncio
import time

from gateway.dev.charges import MAX_ATTEMPTS, charges_received, new_queue_name, running
from gateway.dev.stack import dev_stack

QUEUE_IN_ONE_LINE = ("Each job runs under a fenced lease; a dedupe key makes a job once, "
                     "and an idempotency key makes its charge once.")


async def run_queue_demo() -> int:
    """The job platform's scenario, end to end; 0 when every step held."""
    async with dev_stack(gateway_port=0, own_files=False) as stack:
        t0 = time.monotonic()

        def say(who: str, what: str) -> None:
            print(f"  t={time.monotonic() - t0:5.2f}s  {who:<9} {what}", flush=True)

        name = new_queue_name()
        print(f"\nThe job platform, on queue {name}.\n{QUEUE_IN_ONE_LINE}\n")
        async with running(stack.dsn, stack.url, stack.api_key, name, say) as charges:
            first = await charges.charge()
            order = 1001
            say("you", f"enqueue a charge for order {order} (dedupe key charge-{order}): "
                f"job {first.id}")
            again = await charges.duplicate(order)
            say("you", "duplicate it, the same charge delivered twice: "
                + (f"deduplicated, still job {again.id}, nothing added"
                   if again.deduplicated and again.id == first.id
                   else f"A SECOND JOB {again.id} (this is a bug)"))
            charged = await charges.until_state(first.id, "completed", "dead")
            say("queue", f"job {first.id} {charged}")

            flaky = await charges.flaky()
            say("you", f"enqueue a flaky job: job {flaky}")
            flaky_end = await charges.until_state(flaky, "completed", "dead")
            say("queue", f"job {flaky} {flaky_end} after retrying on its own")

            poison = await charges.poison()
            say("you", f"enqueue a poison job: job {poison}")
            if await charges.until_state(poison, "dead") != "dead":
                say("queue", f"job {poison} DID NOT DIE (this is a bug)")
                return 1
            row = await charges.client.fetchrow("show_job", poison)
            assert row is not None
            say("queue", f"job {poison} is dead after {row['attempts']} of {MAX_ATTEMPTS} "
                f"attempts, kept with its last error: {row['last_error']}")
            charges.fix()
            say("you", "fix the bug (deploy), then replay the dead letters: "
                f"{await charges.replay([poison])} job back in the queue")
            poison_end = await charges.until_state(poison, "completed", "dead")
            say("queue", f"job {poison} {poison_end} after the replay")
        await asyncio.sleep(0)
        got = charges_received(stack.hook, order)
        print(f"\nThe payments sink received {got} charge(s) for order {order}: "
              + ("charged once.\n" if got == 1 else "that is wrong.\n"))
        held = (got == 1 and again.deduplicated and charged == flaky_end == "completed"
                and poison_end == "completed")
        return 0 if held else 1
