"""Statements per effect on the response path (section 5 of bench/run.py).

The gateway is pointed at a wire proxy (bench/pgwire.py) that counts its
round trips by statement, admission or outcome, and can hold back every
answer of the database by a fixed delay:

- **awaited before the answer**: one caller, sequential effects, first with
  no delay, then with every database answer held back ``DELAY`` seconds.
  A caller that waits for k round trips waits k times what one round trip
  gains from the delay, so k = (p50 with the delay - p50 without) / (the
  same for one ``SELECT 1`` through the same proxy, measured alongside).
  Statements written behind the answer add nothing, whatever their number.
- **per effect, counted**: admission and outcome round trips over the effects
  answered, for one caller and for a closed loop of ``CALLERS`` (where
  admissions of one event-loop turn share a statement, and so do outcomes).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import asyncpg

from .harness import API_KEY, free_port, fresh_database, gateway, pct, peer, say, wait_port
from .loadgen import run_load
from .pgwire import WireProxy

#: how long every database answer is held back in the delayed run
DELAY = 0.020
CALLERS = 32
SEQUENTIAL = 100
DELAYED = 40


async def _select_one(dsn: str, n: int) -> list[float]:
    """``n`` round trips of ``SELECT 1`` on one connection, after warming up: ms each."""
    conn = await asyncpg.connect(dsn)
    try:
        for _ in range(5):  # prepared and cached: one round trip from here on
            await conn.fetchval("SELECT 1")
        latencies = []
        for _ in range(n):
            started = time.perf_counter()
            await conn.fetchval("SELECT 1")
            latencies.append((time.perf_counter() - started) * 1000)
        return latencies
    finally:
        await conn.close()


async def _sequential(session: aiohttp.ClientSession, url: str,
                      leases: list[tuple[str, int]], n: int, run: str) -> list[float]:
    """``n`` effects one after another: each one's latency, in ms."""
    latencies = []
    for i in range(n):
        resource, fence = leases[i % len(leases)]
        started = time.perf_counter()
        async with session.post(f"{url}/v1/http/sink/x", json={"i": i}, headers={
                "Authorization": f"Bearer {API_KEY}", "Fence-Resource": resource,
                "Fence-Token": str(fence), "Idempotency-Key": f"{run}-{i}"}) as r:
            await r.read()
            assert r.status == 200, r.status
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def _per_effect(before: dict[str, int], after: dict[str, int], effects: int) -> dict[str, float]:
    return {k: (after[k] - before[k]) / effects for k in after}


async def response_path(server_dsn: str) -> dict[str, Any]:
    """Measure, write the table, and answer the figures."""
    dsn = await fresh_database(server_dsn)
    proxy = await WireProxy(dsn).start()
    sink_port, smtp_port = free_port(), free_port()
    try:
        with peer("sink", sink_port):
            await wait_port(sink_port)
            async with gateway(dsn, sink_port, smtp_port, 1,
                               gateway_dsn=proxy.dsn_via(dsn)) as gw:
                async with aiohttp.ClientSession() as s:
                    await _sequential(s, gw.url, gw.leases, 50, "warm")
                    await asyncio.sleep(0.5)  # the last outcome lands
                    before = proxy.snapshot()
                    plain = await _sequential(s, gw.url, gw.leases, SEQUENTIAL, "plain")
                    await asyncio.sleep(0.5)
                    one = _per_effect(before, proxy.snapshot(), SEQUENTIAL)
                    select_plain = await _select_one(proxy.dsn_via(dsn), DELAYED)
                    proxy.delay = DELAY
                    await _sequential(s, gw.url, gw.leases, 5, "warm-delayed")
                    delayed = await _sequential(s, gw.url, gw.leases, DELAYED, "delayed")
                    select_delayed = await _select_one(proxy.dsn_via(dsn), DELAYED)
                    proxy.delay = 0.0
                    await asyncio.sleep(DELAY * 4)
                marks: dict[str, dict[str, int]] = {}
                load = await asyncio.to_thread(
                    run_load, {"kind": "http", "concurrency": CALLERS,
                               "url": f"{gw.url}/v1/http/sink/x", "leases": gw.leases,
                               "run_id": "counted"},
                    lambda _pid: marks.__setitem__("start", proxy.snapshot()),
                    lambda: marks.__setitem__("end", proxy.snapshot()))
        effects = load["n"] + load["errors"]
        loaded = _per_effect(marks["start"], marks["end"], max(1, effects))
    finally:
        await proxy.close()
    effect_ms = pct(delayed, 0.5) - pct(plain, 0.5)
    trip_ms = pct(select_delayed, 0.5) - pct(select_plain, 0.5)
    waited = effect_ms / trip_ms
    say(f"**Statements on the response path.** The gateway talks to PostgreSQL through a "
        f"wire proxy (bench/pgwire.py) that counts its round trips by statement "
        f"(admission: `fencegate_admit_effect(s)`, outcome: `fencegate_finish_effect(s)`) "
        f"and can hold back every answer of the database. Round trips a caller waits for: "
        f"with every answer held back {DELAY * 1000:g} ms, one caller's p50 went from "
        f"{pct(plain, 0.5):.2f} to {pct(delayed, 0.5):.2f} ms (+{effect_ms:.2f}), and one "
        f"`SELECT 1` round trip through the same proxy from {pct(select_plain, 0.5):.2f} "
        f"to {pct(select_delayed, 0.5):.2f} ms (+{trip_ms:.2f}): the caller waits for "
        f"{effect_ms:.2f} / {trip_ms:.2f} = **{waited:.2f} round trips** before its "
        "answer. A statement written behind the answer adds nothing there, however many "
        "there are.\n")
    say("| round trips per effect | one caller, sequential | "
        f"{CALLERS} callers, closed loop ({effects:,} effects) |")
    say("| --- | ---: | ---: |")
    say(f"| admission (before the answer) | {one['admission']:.2f} | "
        f"{loaded['admission']:.2f} |")
    say(f"| outcome (behind the answer) | {one['outcome']:.2f} | {loaded['outcome']:.2f} |")
    say(f"| anything else (prepares, background loops) | "
        f"{one['prepare'] + one['other']:.2f} | {loaded['prepare'] + loaded['other']:.2f} |")
    say(f"| effects per admission statement | {1 / max(one['admission'], 1e-9):.1f} | "
        f"{1 / max(loaded['admission'], 1e-9):.1f} |")
    say()
    return {"waited": waited, "one": one, "loaded": loaded}
