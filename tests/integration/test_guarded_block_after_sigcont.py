"""Lease rule 6 across SIGSTOP/SIGCONT: a guarded block that was running when
the process stopped is cancelled at its first await after the loss is
noticed, on asyncio and on uvloop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap

import asyncpg
import pytest

#: the child: a guarded loop of short CPU steps, each followed by sleep(0).
#: The loss is noticed when the lease's "lost" warning is logged; the child
#: counts the steps it begins after that.
CHILD = textwrap.dedent("""
    import asyncio, json, logging, sys, time
    from leases import LeaseClient, LeaseLost

    noticed = []

    class Noticed(logging.Handler):
        def emit(self, record):
            if "lost" in record.getMessage():
                noticed.append(True)

    logging.getLogger("fencegate.leases").addHandler(Noticed())
    logging.getLogger("fencegate.leases").setLevel(logging.WARNING)

    async def main(dsn):
        client = LeaseClient(dsn, owner="a")
        lease = await client.claim("run:1", ttl=1.0)
        assert lease is not None
        steps = after_loss = 0
        raised = False
        try:
            async with lease:
                while steps < 5000:
                    if noticed:
                        after_loss += 1
                    steps += 1
                    if steps == 20:
                        print("ready", flush=True)  # the parent stops us from here on
                    end = time.perf_counter() + 0.005
                    while time.perf_counter() < end:  # a short CPU step
                        pass
                    await asyncio.sleep(0)
        except LeaseLost:
            raised = True
        print(json.dumps({"raised": raised, "noticed": bool(noticed), "steps": steps,
                          "after_loss": after_loss}), flush=True)
        await client.close()

    if sys.argv[2] == "uvloop":
        import uvloop
        uvloop.run(main(sys.argv[1]))
    else:
        asyncio.run(main(sys.argv[1]))
""")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_a_block_running_through_sigstop_is_cancelled_at_its_next_await(
    dsn: str, pool: asyncpg.Pool, loop: str,
) -> None:
    """The SIGCONT handler runs inside the guarded task's own step (a CPU
    step has no await for the loop to run anything else in). The loss it
    declares must still cancel the block: the step it interrupted finishes,
    and the block goes no further than its next await. No step begins after
    the loss was noticed."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, dsn, loop,
        stdout=asyncio.subprocess.PIPE, cwd=os.getcwd())
    assert child.stdout is not None
    try:
        assert (await child.stdout.readline()).strip() == b"ready"
        os.kill(child.pid, signal.SIGSTOP)
        # stopped until the lease has expired in the database (so the child's
        # local deadline, which comes before the expiry, has passed too)
        while not await pool.fetchval(
                "SELECT expires_at <= clock_timestamp() FROM fencegate_leases "
                "WHERE resource = 'run:1'"):
            await asyncio.sleep(0.05)
        os.kill(child.pid, signal.SIGCONT)
        report = json.loads(await child.stdout.readline())
    finally:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGCONT)
        await child.wait()
    assert report["noticed"] and report["raised"], report
    assert report["after_loss"] == 0, f"the block ran on after its lease was lost: {report}"
