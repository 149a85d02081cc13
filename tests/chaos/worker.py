"""A chaos worker process, in one of two modes.

    python -m tests.chaos.worker lane NAME DSN GATEWAY_URL API_KEY HISTORY_DIR
        Obeys JSON commands on stdin ({"op": "claim"|"send"|"write", ...}) and
        answers on stdout, so the orchestrator can freeze it (SIGSTOP) between any two steps.
        It sends with a bare (resource, fence) pair and never checks its lease:
        the zombie as a buggy or non-Python worker would be. Only the gateway
        stands between it and a second delivery. "write" is a fenced database
        write (tests.chaos.fenced), checked by the database alone.

    python -m tests.chaos.worker soak NAME DSN GATEWAY_URL API_KEY HISTORY_DIR
        Runs a leases.Worker over the queue "soak"; each job sends one effect
        through GatewayClient under the job's own lease (the lease client in
        full: renewals, cancellation on loss), or, for a job of kind "db", writes
        a row and completes the job in one ``job.transaction``. A job marked
        "snooze" is snoozed once first. Exits when the queue is drained.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gateway.client import FenceToken, GatewayClient, GatewayProblem, GatewayUnreachable
from leases import Job, Lease, LeaseClient, LeaseLost, Queue, RetryPolicy, Snooze, Worker
from tests.chaos import fenced
from tests.chaos.history import Recorder
from tests.chaos.sinks import ANSWER, BODY_HASH_HEADER

SOAK_QUEUE = "soak"
SOAK_TTL = 2.0


def email_body(key: str) -> dict[str, Any]:
    return {"sender": "agent@example.com", "to": ["lead@example.com"],
            "subject": f"effect {key}", "text": "hello"}


#: HTTP effects use every method the gateway forwards
METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")


#: a large body: seconds on a slow link (cluster.SLOW_LINK_RATE)
LARGE_BODY_BYTES = 300_000


def http_body(key: str, method: str, large: bool = False) -> bytes:
    """The body of an HTTP effect: a few KB, so a cut one shows (or a large
    one, which a slow link cannot carry within the gateway's timeout)."""
    if method in ("GET", "DELETE"):
        return b""
    return json.dumps({"k": key, "pad": "x" * (LARGE_BODY_BYTES if large else 5000)}).encode()


async def _pieces(body: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(body), 700):  # a chunked upload, in small pieces
        yield body[i:i + 700]
        await asyncio.sleep(0)


async def send(gw: GatewayClient, lease: Any, kind: str, key: str, method: str = "POST",
               chunked: bool = False, large: bool = False) -> tuple[int, str, bool]:
    """One effect attempt: (status, code, whether the answer came whole);
    status 0 when the gateway was not reached."""
    try:
        if kind == "smtp":
            result = await gw.send_email(lease, key, **email_body(key))
            whole = True
        else:
            body = http_body(key, method, large)
            headers = {BODY_HASH_HEADER: hashlib.sha256(body).hexdigest(),
                       "Content-Type": "application/json"}
            data: Any = _pieces(body) if chunked and body else body or None
            result = await gw.request(lease, key, "crm", method, "events", data=data,
                                      headers=headers)
            whole = result.body == ANSWER
        return result.status, "replayed" if result.replayed else "ok", whole
    except GatewayProblem as p:
        return p.status, p.code, True
    except GatewayUnreachable as e:
        return 0, type(e.__cause__).__name__, True


async def lane(name: str, dsn: str, url: str, key: str, rec: Recorder) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out_lock = asyncio.Lock()
    tasks: set[asyncio.Task[None]] = set()

    async def reply(data: dict[str, Any]) -> None:
        async with out_lock:
            sys.stdout.write(json.dumps(data) + "\n")
            sys.stdout.flush()

    held: dict[tuple[str, int], Lease] = {}
    async with LeaseClient(dsn, owner=name, pool_size=2) as leases, \
            GatewayClient(url, key, timeout_seconds=20) as gw:

        async def do(cmd: dict[str, Any]) -> None:
            if cmd["op"] == "write":
                lease = held.get((cmd["resource"], cmd["fence"])) if cmd.get("api") else None
                outcome, code = await fenced.write(
                    rec, name, dsn, cmd["resource"], cmd["fence"], lease=lease,
                    before=cmd.get("before", 0.0), inside=cmd.get("inside", 0.0),
                    working=cmd.get("working", False))
                await reply({"id": cmd["id"], "outcome": outcome, "code": code})
            elif cmd["op"] == "claim":
                try:
                    lease = await leases.claim(cmd["resource"], cmd["ttl"])
                except Exception as exc:  # the database is down (the HA run's failovers)
                    await reply({"id": cmd["id"], "fence": None, "expires": None,
                                 "error": type(exc).__name__})
                    return
                if lease is not None:
                    held[(lease.resource, lease.fence)] = lease
                    expires = lease.expires_at.timestamp()
                    rec.record("claim", owner=name, resource=lease.resource,
                               fence=lease.fence, granted=expires - cmd["ttl"],
                               expires=expires, renews=False)
                await reply({"id": cmd["id"], "fence": lease.fence if lease else None,
                             "expires": lease.expires_at.timestamp() if lease else None})
            else:
                await asyncio.sleep(cmd.get("delay", 0))
                t0 = time.time()
                status, code, whole = await send(gw, FenceToken(cmd["resource"], cmd["fence"]),
                                                 cmd["kind"], cmd["key"])
                rec.record("attempt", owner=name, key=cmd["key"], kind=cmd["kind"],
                           resource=cmd["resource"], fence=cmd["fence"], t0=t0,
                           t1=time.time(), status=status, code=code, whole=whole)
                await reply({"id": cmd["id"], "status": status, "code": code})

        while line := await reader.readline():
            task = loop.create_task(do(json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


class RecordingQueue(Queue):
    """Records every claim it makes: the history needs each fence granted."""

    rec: Recorder

    async def claim(self, owner: str | None = None, *, limit: int = 1,
                    ttl: float = 30.0) -> list[Job]:
        return self._recorded(await super().claim(owner, limit=limit, ttl=ttl), ttl)

    async def claimed_by(self, owner: str, ttl: float) -> list[Job]:
        """The take-up after a claim that got no answer: its fences were
        granted, and only this answer tells them."""
        return self._recorded(await super().claimed_by(owner, ttl), ttl)

    def _recorded(self, jobs: list[Job], ttl: float) -> list[Job]:
        for job in jobs:
            expires = job.lease.expires_at.timestamp()
            self.rec.record("claim", owner=job.lease.owner, resource=job.resource,
                            fence=job.fence, granted=expires - ttl, expires=expires,
                            renews=True)
        return jobs


async def soak(name: str, dsn: str, url: str, key: str, rec: Recorder) -> None:
    async with LeaseClient(dsn, owner=f"{name}", pool_size=6) as leases, \
            GatewayClient(url, key, timeout_seconds=10) as gw:
        q = RecordingQueue(leases, SOAK_QUEUE, recovery_interval=0.5,
                           retry=RetryPolicy(max_attempts=1000, base_seconds=0.05,
                                             cap_seconds=0.5))
        q.rec = rec

        async def handle(job: Job) -> str:
            kind = job.payload["kind"]
            if job.payload.get("snooze") and not job.snoozes:
                rec.record("snooze", owner=name, job=job.id, resource=job.resource,
                           fence=job.fence)
                raise Snooze(0.05)
            if kind == "db":
                return await fenced.job_write(rec, name, q, job)
            effect_key = f"job-{job.id}"
            t0 = time.time()
            status, code, whole = await send(gw, job.lease, kind, effect_key,
                                             job.payload.get("method", "POST"),
                                             job.payload.get("chunked", False),
                                             job.payload.get("large", False))
            rec.record("attempt", owner=name, key=effect_key, kind=kind,
                       resource=job.resource, fence=job.fence, t0=t0, t1=time.time(),
                       status=status, code=code, job=job.id, whole=whole)
            if status == 200:
                return code
            if code == "effect_outcome_unknown":
                return "unknown"  # done for the worker; an operator settles the effect
            raise RuntimeError(f"effect {effect_key}: {status} {code}")

        worker = Worker(q, handle, concurrency=4, ttl=SOAK_TTL, poll_min=0.02, poll_max=0.2,
                        backstop_interval=1.0, grace=1.0)
        task = asyncio.create_task(worker.run())
        while True:
            await asyncio.sleep(1.0)
            try:
                stats = await q.stats()
            except Exception:
                continue  # the database is down: keep going
            # retried jobs wait out their backoff as "scheduled": not drained yet
            if not any(stats.get(s) for s in ("queued", "scheduled", "claimed")):
                break
        worker.stop()
        await task


def main() -> None:
    mode, name, dsn, url, key, history = sys.argv[1:7]
    rec = Recorder(Path(history), name)
    try:
        asyncio.run((lane if mode == "lane" else soak)(name, dsn, url, key, rec))
    except LeaseLost:
        pass


if __name__ == "__main__":
    main()
