"""The load generator: a process of its own, pinned to the last CPU so it
cannot crowd the gateway off the first, on uvloop.

``run_load(spec)`` starts it, waits for it, and answers what it measured. It
warms up first (connections, prepared statements, caches), then tells the
parent the timed phase has begun (``on_start``) and when it has ended
(``on_end``), so the parent can sample what it watches (CPU seconds, wire
counters) over exactly that phase.

A spec: ``kind`` (http, email, smtp-naive, smtp-pooled), ``url``, ``leases``
(spread over, one idempotency key per request), ``body``, ``message`` (the
bytes the direct SMTP kinds send), ``run_id``, and
either ``rate`` (an open loop, requests/s) or ``concurrency`` (a closed loop
of callers); ``keep_latencies`` to have every latency back, in ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import aiosmtplib

from .harness import API_KEY, SECONDS, WARMUP_SECONDS, pct


def _pin_last_cpu() -> None:
    with contextlib.suppress(AttributeError, OSError):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:
            os.sched_setaffinity(0, {cpus[-1]})


def loadgen(spec: dict[str, Any], out: Any) -> None:
    import uvloop

    _pin_last_cpu()
    uvloop.run(_loadgen(spec, out))


async def _loadgen(spec: dict[str, Any], out: Any) -> None:
    counter = iter(range(10**9))
    send = await _sender(spec["kind"], spec, counter)
    if WARMUP_SECONDS > 0:
        await _drive(send, {**spec, "seconds": WARMUP_SECONDS, "keep_latencies": False})
    out.put(("start", None))
    result = await _drive(send, spec)
    out.put(("end", None))
    await send.close()
    out.put(("result", result))


async def _drive(send: _Sender, spec: dict[str, Any]) -> dict[str, Any]:
    seconds = spec["seconds"]
    latencies: list[float] = []
    errors = 0

    codes: dict[str, int] = {}

    async def one() -> None:
        nonlocal errors
        t = time.perf_counter()
        try:
            ok: bool | str = await send()
        except Exception as exc:
            ok = type(exc).__name__
        if ok is True:
            latencies.append((time.perf_counter() - t) * 1000)
        else:
            errors += 1
            code = ok if isinstance(ok, str) else "error"
            codes[code] = codes.get(code, 0) + 1

    started = time.perf_counter()
    end = started + seconds
    if spec.get("rate"):  # open loop: a fixed arrival rate, whatever the latency
        interval = 1 / spec["rate"]
        tasks = []
        next_at = started
        while next_at < end:
            tasks.append(asyncio.create_task(one()))
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.gather(*tasks)
    else:  # closed loop: N callers back to back
        async def caller() -> None:
            while time.perf_counter() < end:
                await one()
        await asyncio.gather(*(caller() for _ in range(spec["concurrency"])))
    elapsed = time.perf_counter() - started
    result = {"n": len(latencies), "errors": errors, "seconds": elapsed,
              "p50": pct(latencies, 0.50), "p99": pct(latencies, 0.99),
              "rps": len(latencies) / elapsed, "codes": codes}
    if spec.get("keep_latencies"):
        result["latencies"] = latencies
    return result


class _Sender:
    """Sends one request: True when it succeeded, else the problem code (or
    the status) it got."""

    def __init__(self, fn: Callable[[], Awaitable[bool | str]],
                 close: Callable[[], Awaitable[None]]) -> None:
        self._fn, self.close = fn, close

    def __call__(self) -> Awaitable[bool | str]:
        return self._fn()


async def _sender(kind: str, spec: dict[str, Any], counter: Iterator[int]) -> _Sender:
    run_id = spec.get("run_id", "r")
    if kind in ("http", "email"):
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512))
        url = spec["url"]
        leases = spec.get("leases") or []
        body = spec.get("body", {"event": "lead.updated", "id": 42})

        async def http() -> bool | str:
            i = next(counter)
            headers = {}
            if leases:
                resource, fence = leases[i % len(leases)]
                headers = {"Authorization": f"Bearer {API_KEY}", "Fence-Resource": resource,
                           "Fence-Token": str(fence), "Idempotency-Key": f"{run_id}-{i}"}
            async with session.post(url, json=body, headers=headers) as r:
                await r.read()
                return True if r.status == 200 else \
                    r.headers.get("Fencegate-Problem", str(r.status))

        return _Sender(http, session.close)
    # direct SMTP: a four-line message, or ``message`` (e.g. the bytes the
    # gateway builds for its email, so that the sink parses the same message)
    message = spec["message"].encode() if "message" in spec else \
        b"From: a@example.com\r\nTo: b@example.com\r\nSubject: bench\r\n\r\nhello\r\n"
    port = spec["smtp_port"]
    if kind == "smtp-naive":
        async def naive() -> bool:
            await aiosmtplib.send(message, sender="a@example.com", recipients=["b@example.com"],
                                  hostname="127.0.0.1", port=port, start_tls=False)
            return True

        async def nothing() -> None:
            return None

        return _Sender(naive, nothing)
    pool: asyncio.Queue[aiosmtplib.SMTP] = asyncio.Queue()
    for _ in range(spec["concurrency"]):
        conn = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False)
        await conn.connect()
        pool.put_nowait(conn)

    async def pooled() -> bool:
        conn = await pool.get()
        try:
            await conn.sendmail("a@example.com", ["b@example.com"], message)
        finally:
            pool.put_nowait(conn)
        return True

    async def close_all() -> None:
        while not pool.empty():
            conn = pool.get_nowait()
            with contextlib.suppress(Exception):
                await conn.quit()

    return _Sender(pooled, close_all)


def run_load(spec: dict[str, Any], on_start: Callable[[int], None] | None = None,
             on_end: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run one load in a fresh load-generator process and answer its result.
    ``on_start(pid)`` is called (with the load generator's pid) when its timed
    phase begins, ``on_end()`` when it ends. It blocks: from async code that
    must keep running meanwhile, call it through ``asyncio.to_thread``."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    spec = {"seconds": SECONDS, **spec}
    p = ctx.Process(target=loadgen, args=(spec, out))
    p.start()
    assert p.pid is not None
    give_up = time.monotonic() + spec["seconds"] * 10 + WARMUP_SECONDS + 60
    while True:
        try:
            what, value = out.get(timeout=1)
        except queue.Empty:
            if not p.is_alive():
                raise RuntimeError(f"the load generator exited ({p.exitcode})") from None
            if time.monotonic() > give_up:
                p.kill()
                raise RuntimeError("the load generator never finished") from None
            continue
        if what == "start" and on_start is not None:
            on_start(p.pid)
        elif what == "end" and on_end is not None:
            on_end()
        elif what == "result":
            break
    p.join(30)
    result: dict[str, Any] = value
    return result
