"""The chaos scenarios: zombie trials, mixed batches, and a mixed soak under
random faults (the fenced database writes' trials: tests.chaos.fenced).

Every random choice (trial timings, which fault, when, for how long) comes from
one ``random.Random(seed)``, so a seed replays the same schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from leases import LeaseClient, NewJob, Queue
from tests.chaos.cluster import API_KEY, SLOW_LINK_RATE, Cluster
from tests.chaos.worker import METHODS, SOAK_QUEUE, SOAK_TTL

ZOMBIE_TTL = 0.4
#: effects with a body a slow link takes seconds to carry (tests.chaos.worker)
LARGE_FRACTION = 0.1
#: soak jobs that write to the database in a fenced transaction instead
#: (tests.chaos.fenced), under the soak's faults
DB_FRACTION = 0.2
#: soak jobs whose handler snoozes them once before it does its work
SNOOZE_FRACTION = 0.1
#: soak jobs the orchestrator tries to cancel, at random moments while the
#: workers run them (or before, or after)
CANCEL_FRACTION = 0.05


class LaneWorker:
    """A lane-mode worker process driven over its stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def spawn(cls, cluster: Cluster, name: str) -> LaneWorker:
        from tests.chaos.cluster import PY, ROOT

        with (cluster.dir / f"lane-{name}.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                PY, "-m", "tests.chaos.worker", "lane", name, cluster.pg_dsn, cluster.url,
                API_KEY, str(cluster.history), cwd=ROOT, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=log)
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            fut = self._waiting.pop(msg["id"], None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    def call(self, **cmd: Any) -> asyncio.Future[dict[str, Any]]:
        self._next += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = fut
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"id": self._next, **cmd}) + "\n").encode())
        return fut

    async def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        await self.proc.wait()
        self._reader.cancel()


@dataclass
class TrialStats:
    trials: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


async def zombie_trial(cluster: Cluster, a: LaneWorker, b: LaneWorker, name: str,
                       rng: random.Random, stats: TrialStats) -> None:
    """A claims and starts to send; it is frozen (SIGSTOP) at a random point
    around the send, past its ttl; B usually takes over and sends the same
    logical effect; A is thawed and carries on as if nothing happened."""
    resource, key = f"run:{name}", name
    # half the time A's effect is the very one B will send (must land once), half
    # the time one of A's own (must not land at all once A is stale)
    key_a = key if rng.random() < 0.5 else f"{name}-a"
    kind = rng.choice(["smtp", "http"])
    # freeze A before, during or after its send, in about equal parts
    send_delay, stop_after = rng.uniform(0.02, 0.12), rng.uniform(0, 0.2)
    takeover = rng.random() < 0.7
    claimed = await asyncio.wait_for(a.call(op="claim", resource=resource, ttl=ZOMBIE_TTL), 30)
    fence_a = claimed["fence"]
    assert fence_a is not None, "a fresh resource must be free"
    sent_a = a.call(op="send", resource=resource, fence=fence_a, key=key_a, kind=kind,
                    delay=send_delay)
    await asyncio.sleep(stop_after)
    frozen_at = time.time()
    os.kill(a.pid, signal.SIGSTOP)
    await asyncio.sleep(max(0.0, claimed["expires"] - time.time()) + 0.05)
    if takeover:
        fence_b = None
        for _ in range(400):  # may wait out A's effect in flight: the drain barrier
            got = await asyncio.wait_for(b.call(op="claim", resource=resource, ttl=5), 30)
            fence_b = got["fence"]
            if fence_b is not None:
                break
            await asyncio.sleep(0.025)
        assert fence_b is not None, f"{name}: B never got the resource"
        answer_b = await asyncio.wait_for(
            b.call(op="send", resource=resource, fence=fence_b, key=key, kind=kind), 30)
        stats.outcomes[f"B {answer_b['status']} {answer_b['code']}"] += 1
    os.kill(a.pid, signal.SIGCONT)
    cluster.fault("zombie", frozen_at, time.time())
    answer_a = await asyncio.wait_for(sent_a, 30)
    stats.outcomes[f"A {answer_a['status']} {answer_a['code']}"] += 1
    stats.trials += 1


async def zombie_trials(cluster: Cluster, trials: int, lanes: int,
                        rng: random.Random) -> TrialStats:
    stats = TrialStats()
    seeds = [rng.randrange(2**32) for _ in range(lanes)]

    async def lane(index: int) -> None:
        lane_rng = random.Random(seeds[index])
        a = await LaneWorker.spawn(cluster, f"lane{index}-a")
        b = await LaneWorker.spawn(cluster, f"lane{index}-b")
        try:
            for t in range(index, trials, lanes):
                await zombie_trial(cluster, a, b, f"z{t}", lane_rng, stats)
        finally:
            await a.close()
            await b.close()

    await asyncio.gather(*(lane(i) for i in range(lanes)))
    return stats


# ---- batches of stale and current fences on the same resources -------------------

MIXED_RESOURCES = 4
#: effects each worker sends per resource in one burst
MIXED_PER_RESOURCE = 6


@dataclass
class MixedStats:
    rounds: int = 0
    requests: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


async def mixed_batches(cluster: Cluster, rounds: int, rng: random.Random) -> MixedStats:
    """Group commit is exactly where a fence bug would hide: one admission
    statement carries many effects, on the same lease rows, some under a
    stale fence and some under the current one. Each round, A claims a few
    resources and lets the leases lapse, B takes them over, then both fire
    all at once: A (now a zombie) under its stale fences, B under the current
    ones, with keys A and B share (must land once, B's), keys of A's own (must
    not land), and keys B sends twice at once (must land once). The checker
    judges every delivery against the fences granted."""
    stats = MixedStats()
    a = await LaneWorker.spawn(cluster, "mixed-a")
    b = await LaneWorker.spawn(cluster, "mixed-b")
    try:
        for r in range(rounds):
            resources = [f"mixed:{r}:{i}" for i in range(MIXED_RESOURCES)]
            claimed_a = await asyncio.gather(*(a.call(op="claim", resource=res, ttl=ZOMBIE_TTL)
                                              for res in resources))
            fences_a = [c["fence"] for c in claimed_a]
            assert None not in fences_a, "a fresh resource must be free"
            await asyncio.sleep(max(0.0, max(c["expires"] for c in claimed_a) - time.time())
                                + 0.05)
            fences_b = [await _take_over(b, res) for res in resources]
            sends: list[asyncio.Future[dict[str, Any]]] = []
            for res, fa, fb in zip(resources, fences_a, fences_b, strict=True):
                for n in range(MIXED_PER_RESOURCE):
                    kind = rng.choice(["smtp", "http"])
                    shared = f"{res}:k{n}"
                    own = shared if rng.random() < 0.5 else f"{res}:a{n}"
                    sends.append(a.call(op="send", resource=res, fence=fa, key=own, kind=kind))
                    sends.append(b.call(op="send", resource=res, fence=fb, key=shared,
                                        kind=kind))
                    if rng.random() < 0.3:  # the same key twice at once
                        sends.append(b.call(op="send", resource=res, fence=fb, key=shared,
                                            kind=kind))
            rng.shuffle(sends)
            for answer in await asyncio.wait_for(asyncio.gather(*sends), 60):
                stats.outcomes[f"{answer['status']} {answer['code']}"] += 1
            stats.requests += len(sends)
            stats.rounds += 1
    finally:
        await a.close()
        await b.close()
    return stats


async def _take_over(worker: LaneWorker, resource: str) -> int:
    for _ in range(400):  # may wait out an effect in flight: the drain barrier
        got = await asyncio.wait_for(worker.call(op="claim", resource=resource, ttl=30), 30)
        if got["fence"] is not None:
            fence: int = got["fence"]
            return fence
        await asyncio.sleep(0.025)
    raise AssertionError(f"{resource}: never taken over")


# ---- the mixed soak -------------------------------------------------------------

FAULTS = ["zombie", "kill_worker", "kill_gateway", "restart_postgres", "db_proxy_drop",
          "db_proxy_blackhole", "gw_proxy_delay", "gw_proxy_drop", "gw_proxy_blackhole",
          # between admission and send: the gateway's own delays
          "pause_gateway", "saturate_smtp", "db_proxy_delay",
          # a statement that committed, its answer lost
          "db_proxy_lose_replies",
          # bytes the gateway wrote, still in its kernel when the attempt ends
          # (issue 21): a slow link, a provider that stops reading, a gateway
          # killed mid-send
          "slow_link", "stalled_provider", "kill_gateway_mid_send"]


@dataclass
class SoakStats:
    faults: Counter[str] = field(default_factory=Counter)
    pg_recovery_seconds: list[float] = field(default_factory=list)
    gateway_recovery_seconds: list[float] = field(default_factory=list)
    final_jobs: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


async def soak(cluster: Cluster, workers: int, effects: int, spread_seconds: float,
               rng: random.Random, faults: list[str] | None = None,
               limit_seconds: float = 1500) -> SoakStats:
    """``effects`` jobs (each one email or HTTP effect) spread over
    ``spread_seconds``, processed by ``workers`` worker processes while faults
    strike one after another: the given list, or random ones until the queue
    is drained."""
    stats = SoakStats()
    started = time.monotonic()
    pool = await asyncpg.create_pool(cluster.pg_dsn, min_size=1, max_size=2)
    q = Queue(LeaseClient(pool=pool), SOAK_QUEUE)
    now = dt.datetime.now(dt.UTC)
    jobs = [NewJob({"kind": "db" if rng.random() < DB_FRACTION else rng.choice(["smtp", "http"]),
                    "method": rng.choice(METHODS),
                    "chunked": rng.random() < 0.2, "large": rng.random() < LARGE_FRACTION,
                    "snooze": rng.random() < SNOOZE_FRACTION},
                   run_at=now + dt.timedelta(seconds=rng.uniform(0, spread_seconds)),
                   max_attempts=1000)
            for _ in range(effects)]
    ids: list[int] = []
    for i in range(0, len(jobs), 1000):
        ids += await q.enqueue_many(jobs[i:i + 1000])
    await pool.close()
    targets = rng.sample(ids, max(1, int(len(ids) * CANCEL_FRACTION)))
    stop_cancelling = asyncio.Event()
    cancelling = asyncio.create_task(cancels(cluster, targets, spread_seconds, rng,
                                             stop_cancelling))

    procs: list[Any] = []
    names = iter(range(10**6))

    def spawn() -> None:
        procs.append(cluster._spawn("tests.chaos.worker", "soak", f"soak{next(names)}",
                                    cluster.pg_dsn, cluster.url, API_KEY,
                                    str(cluster.history)))

    for _ in range(workers):
        spawn()

    schedule = list(faults) if faults is not None else None
    try:
        while time.monotonic() - started < limit_seconds:
            if (schedule is None or not schedule) and await drained(cluster.pg_dsn):
                break
            if schedule is not None and not schedule:
                await asyncio.sleep(0.5)
                continue
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            kind = schedule.pop(0) if schedule is not None else rng.choice(FAULTS)
            stats.faults[kind] += 1
            await strike(cluster, kind, procs, spawn, rng, stats)
        else:
            raise AssertionError(f"the soak did not drain in {limit_seconds:.0f}s: jobs "
                                 f"{await job_states(cluster.pg_dsn)}")
    finally:
        stop_cancelling.set()
        await cancelling
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
        for p in procs:
            try:
                await asyncio.to_thread(p.wait, 30)
            except Exception:
                p.kill()
    conn = await asyncpg.connect(cluster.pg_dsn)
    rows = await conn.fetch("SELECT state, count(*) AS n FROM fencegate_jobs GROUP BY state")
    stats.final_jobs = {r["state"]: r["n"] for r in rows}
    for r in await conn.fetch("SELECT id, state FROM fencegate_jobs WHERE id = ANY($1)",
                              targets):
        cluster.rec.record("job_final", job=r["id"], state=r["state"])
    await conn.close()
    stats.seconds = time.monotonic() - started
    return stats


async def cancels(cluster: Cluster, targets: list[int], spread_seconds: float,
                  rng: random.Random, stop: asyncio.Event) -> None:
    """Cancel each of ``targets`` once, at random moments over the soak's
    spread, racing the workers' completions. Each cancel that was answered is
    recorded with the moment its answer came (its commit was before): the
    checker holds every later attempt under that job's fence to a refusal.
    A cancel that got no answer (the database is down) is not retried."""
    pending = list(targets)
    pace = max(0.02, spread_seconds / max(1, len(pending)))
    while pending and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(0, 2 * pace))
        job_id = pending.pop()
        try:
            conn = await asyncpg.connect(cluster.pg_dsn, timeout=2)
        except (TimeoutError, OSError, asyncpg.PostgresError):
            continue
        try:
            rows = await asyncio.wait_for(conn.fetch(
                "SELECT job_id, was FROM fencegate_cancel_jobs($1, $2::bigint[])",
                SOAK_QUEUE, [job_id]), 5)
        except (TimeoutError, OSError, asyncpg.PostgresError):
            continue
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)
        cluster.rec.record("cancel", job=job_id, resource=f"job:{SOAK_QUEUE}:{job_id}",
                           cancelled=bool(rows), was=rows[0]["was"] if rows else None,
                           answered=time.time())


async def job_states(dsn: str) -> dict[str, int]:
    """Jobs by state, with queued jobs not yet due counted as scheduled."""
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        rows = await conn.fetch(
            "SELECT CASE WHEN state = 'queued' AND run_at > clock_timestamp() "
            "THEN 'scheduled' ELSE state END AS s, count(*) AS n FROM fencegate_jobs GROUP BY 1")
        return {r["s"]: r["n"] for r in rows}
    finally:
        await conn.close()


async def drained(dsn: str) -> bool:
    """No job queued or claimed (False while the database is unreachable)."""
    try:
        conn = await asyncpg.connect(dsn, timeout=2)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    try:
        n = await conn.fetchval("SELECT count(*) FROM fencegate_jobs "
                                "WHERE state IN ('queued', 'claimed')")
        return bool(n == 0)
    finally:
        await conn.close()


async def freeze(cluster: Cluster, victim: Any) -> None:
    """A worker process frozen past its leases' ttl, then thawed: a zombie."""
    start = time.time()
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(SOAK_TTL * 1.5)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    cluster.fault("zombie", start, time.time())


async def strike(cluster: Cluster, kind: str, procs: list[Any], spawn: Any,
                 rng: random.Random, stats: SoakStats) -> None:
    live = [p for p in procs if p.poll() is None]
    if kind == "zombie" and live:
        await freeze(cluster, rng.choice(live))
    elif kind == "kill_worker" and live:
        victim = rng.choice(live)
        start = time.time()
        victim.kill()
        victim.wait()
        spawn()
        cluster.fault("kill_worker", start, time.time())
    elif kind == "kill_gateway":
        stats.gateway_recovery_seconds.append(await cluster.kill_gateway())
    elif kind == "kill_gateway_mid_send":
        stats.gateway_recovery_seconds.append(
            await cluster.kill_gateway_mid_send(rng.uniform(0.3, 0.9)))
    elif kind in ("slow_link", "stalled_provider"):
        await cluster.slow_links(SLOW_LINK_RATE if kind == "slow_link" else 0)
    elif kind in ("pause_gateway", "saturate_smtp"):
        # the gateway held up (frozen, or waiting for an SMTP connection) while
        # a worker whose effect it holds is frozen past its lease: the job is
        # recovered and claimed again under a new fence meanwhile
        held = cluster.pause_gateway() if kind == "pause_gateway" \
            else cluster.saturate_smtp(rng.uniform(2.5, 4.0))
        await asyncio.gather(held, *([freeze(cluster, rng.choice(live))] if live else []))
    elif kind == "restart_postgres":
        stats.pg_recovery_seconds.append(
            await cluster.restart_postgres(rng.uniform(0.5, 2.0)))
    elif kind.endswith(("_drop", "_blackhole", "_delay", "_lose_replies")):
        which, _, mode = kind.partition("_proxy_")
        await cluster.proxy_fault(which, mode, rng.uniform(0.5, 2.0))
