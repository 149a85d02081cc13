"""``make ha``: the chaos suite's workload across PostgreSQL switchovers and
hard failovers, on a Patroni cluster with gateways scaled out, checked.

    python -m tests.ha.run [--seed N]             quick: synchronous replication,
                                                  one switchover, one failover
    python -m tests.ha.run --full [--seed N]      synchronous, then asynchronous
                                                  replication, each across
                                                  switchover, failover, switchover,
                                                  failover; figures written to
                                                  docs/RELIABILITY.md, "High
                                                  availability"

Exit status 1 when the synchronous run found a violation (the asynchronous
one is expected to, and is reported).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncpg

from leases import LeaseClient, NewJob, Queue
from tests.chaos import history
from tests.chaos.checker import OUTAGE_GRACE_SECONDS, Report, check, provider_key
from tests.chaos.scenarios import ZOMBIE_TTL, LaneWorker, drained, job_states
from tests.chaos.worker import METHODS, SOAK_QUEUE
from tests.ha.cluster import API_KEY, CLIENT, HACluster
from tests.ha.report import markdown, write_section

#: seconds of steady load before the first failure, and between failures
WARMUP_SECONDS = 8.0


@dataclass
class Mode:
    synchronous: bool
    schedule: list[str]
    effects: int
    spread: float
    workers: int
    lanes: int
    gap: float
    #: how far behind the standbys are held when the leader is killed
    lag: float = 1.0


QUICK = Mode(True, ["switchover", "failover"], effects=600, spread=60, workers=4, lanes=2,
             gap=15)
FULL = [Mode(sync, ["switchover", "failover", "switchover", "failover"], effects=2000,
             spread=120, workers=6, lanes=2, gap=20) for sync in (True, False)]


@dataclass
class HARun:
    seed: int
    mode: Mode
    failures: list[dict[str, Any]]
    report: Report
    trials: Counter[str]
    seconds: float
    per_failure: list[dict[str, Any]] = field(default_factory=list)


# ---- the workload ------------------------------------------------------------


async def enqueue(dsn: str, n: int, spread: float, rng: random.Random) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        q = Queue(LeaseClient(pool=pool), SOAK_QUEUE)
        now = dt.datetime.now(dt.UTC)
        jobs = [NewJob({"kind": rng.choice(["smtp", "http"]), "method": rng.choice(METHODS),
                        "chunked": rng.random() < 0.2},
                       run_at=now + dt.timedelta(seconds=rng.uniform(0, spread)),
                       max_attempts=1000)
                for _ in range(n)]
        for i in range(0, n, 500):
            await q.enqueue_many(jobs[i:i + 500])
    finally:
        await pool.close()


async def lane(cluster: HACluster, index: int, rng: random.Random, stop: asyncio.Event,
               outcomes: Counter[str]) -> None:
    """Zombie trials, one after another, until told to stop: A claims (ttl
    0.4 s) and sends, is frozen around the send past its ttl, B takes over and
    sends the same logical effect, A is thawed. Through a failover, either
    may meet a database that is not there: that is counted, not a failure."""
    # A and B use different gateways, and alternate between the direct and
    # the pooled database path for their claims
    views = [SimpleNamespace(dir=cluster.dir, history=cluster.history,
                             pg_dsn=cluster.dsn if (index + k) % 2 == 0 else cluster.pooled_dsn,
                             url=cluster.gateway_url(index + k)) for k in (0, 1)]
    a = await LaneWorker.spawn(views[0], f"lane{index}-a")  # type: ignore[arg-type]
    b = await LaneWorker.spawn(views[1], f"lane{index}-b")  # type: ignore[arg-type]
    try:
        n = 0
        while not stop.is_set():
            await trial(cluster, a, b, f"h{index}-{n}", rng, outcomes)
            n += 1
    finally:
        await a.close()
        await b.close()


async def trial(cluster: HACluster, a: LaneWorker, b: LaneWorker, name: str,
                rng: random.Random, outcomes: Counter[str]) -> None:
    resource, key = f"run:{name}", name
    key_a = key if rng.random() < 0.5 else f"{name}-a"
    kind = rng.choice(["smtp", "http"])
    send_delay, stop_after = rng.uniform(0.02, 0.12), rng.uniform(0, 0.2)
    claimed = await asyncio.wait_for(a.call(op="claim", resource=resource, ttl=ZOMBIE_TTL), 60)
    if claimed["fence"] is None:
        outcomes[f"A claim failed: {claimed.get('error', 'held')}"] += 1
        await asyncio.sleep(0.5)
        return
    sent_a = a.call(op="send", resource=resource, fence=claimed["fence"], key=key_a,
                    kind=kind, delay=send_delay)
    await asyncio.sleep(stop_after)
    frozen_at = time.time()
    os.kill(a.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(max(0.0, claimed["expires"] - time.time()) + 0.05)
        if rng.random() < 0.7:
            fence_b, give_up = None, time.monotonic() + 60
            while fence_b is None and time.monotonic() < give_up:
                got = await asyncio.wait_for(b.call(op="claim", resource=resource, ttl=5), 60)
                fence_b = got["fence"]
                if fence_b is None:
                    await asyncio.sleep(0.05)
            if fence_b is None:
                outcomes["B never got the resource"] += 1
            else:
                answer = await asyncio.wait_for(b.call(op="send", resource=resource,
                                                       fence=fence_b, key=key, kind=kind), 60)
                outcomes[f"B {answer['status']} {answer['code']}"] += 1
    finally:
        os.kill(a.pid, signal.SIGCONT)
    cluster.fault("zombie", frozen_at, time.time())
    answer_a = await asyncio.wait_for(sent_a, 60)
    outcomes[f"A {answer_a['status']} {answer_a['code']}"] += 1


async def soak_workers(cluster: HACluster, n: int) -> list[Any]:
    """Worker processes (leases.Worker + GatewayClient): each on a gateway of
    its own, half of them with their lease client behind PgBouncer."""
    return [cluster.spawn("tests.chaos.worker", "soak", f"soak{i}",
                          cluster.dsn if i % 2 == 0 else cluster.pooled_dsn,
                          cluster.gateway_url(i), API_KEY, str(cluster.history),
                          name=f"soak{i}")
            for i in range(n)]


# ---- one run -----------------------------------------------------------------


async def run(seed: int, mode: Mode, keep: bool = False) -> HARun:
    label = "synchronous" if mode.synchronous else "asynchronous"
    print(f"ha: {label} replication, seed {seed}, schedule {mode.schedule}", flush=True)
    rng = random.Random(seed)
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="fencegate-ha-"))
    cluster = HACluster(tmp, synchronous=mode.synchronous, seed=seed)
    failures: list[dict[str, Any]] = []
    outcomes: Counter[str] = Counter()
    final_jobs: dict[str, int] = {}
    try:
        await cluster.start()
        print(f"ha: cluster up in {time.monotonic() - started:.0f}s", flush=True)
        await enqueue(cluster.dsn, mode.effects, mode.spread, rng)
        workers = await soak_workers(cluster, mode.workers)
        stop = asyncio.Event()
        lanes = [asyncio.create_task(lane(cluster, i, random.Random(rng.randrange(2**32)),
                                          stop, outcomes)) for i in range(mode.lanes)]
        try:
            await asyncio.sleep(WARMUP_SECONDS)
            for kind in mode.schedule:
                info = await (cluster.switchover() if kind == "switchover"
                              else cluster.hard_failover(lag_seconds=mode.lag))
                print(f"ha: {kind} {info['from']} -> {info['to']}: primary writable again "
                      f"{info['up'] - info['commanded']:.1f}s after the "
                      f"{'command' if kind == 'switchover' else 'kill'}", flush=True)
                failures.append(info)
                await asyncio.sleep(mode.gap)
            limit = time.monotonic() + mode.spread + 300
            while not await drained(cluster.dsn):
                if time.monotonic() > limit:
                    raise AssertionError("the soak did not drain: jobs "
                                         f"{await job_states(cluster.dsn)}")
                await asyncio.sleep(1)
        finally:
            stop.set()
            await asyncio.gather(*lanes, return_exceptions=True)
            for p in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
            for p in workers:
                try:
                    await asyncio.to_thread(p.wait, 30)
                except Exception:
                    p.kill()
        final_jobs = await job_states(cluster.dsn)
    finally:
        await cluster.close()
        await asyncio.sleep(0.5)
        events = history.read(cluster.history)
        if keep:
            print(f"ha: kept {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report = check(events, client=CLIENT, final_jobs=final_jobs, expected_jobs=mode.effects)
    r = HARun(seed, mode, failures, report, outcomes, time.monotonic() - started)
    r.per_failure = [per_failure(events, f) for f in failures]
    return r


def per_failure(events: list[dict[str, Any]], f: dict[str, Any]) -> dict[str, Any]:
    """What one failure did: from the moment the primary stopped (the kill, or
    the first poll that found no writable member after the switchover
    command) to the first effect admitted and answered after it."""
    down = f["down"]
    attempts = [e for e in events if e["ev"] == "attempt" and e["t0"] >= down]
    admitted = [a["t1"] for a in attempts if a["status"] == 200 and a["code"] == "ok"]
    first = min(admitted) if admitted else None
    # answers while no member was a writable primary (what comes between
    # then and the first admitted effect is ordinary service again)
    during = [a for a in attempts if a["t1"] < f["up"]]
    answers = Counter(f"{a['status']} {a['code']}" for a in during)
    # deliveries while no primary was writable: of an effect admitted before
    # the stop (its fence granted before it, and no attempt of it started
    # only after: the provider was still at it), or sent meanwhile (a fence
    # granted after the stop, or every attempt of it started after the stop)
    granted = {(c["resource"], c["fence"]): c["granted"] for c in events if c["ev"] == "claim"}
    starts: dict[tuple[str, int], list[float]] = {}
    for a in events:
        if a["ev"] == "attempt":
            starts.setdefault((provider_key(CLIENT, a["kind"], a["key"]), a["fence"]),
                              []).append(a["t0"])
    in_flight = sent = 0
    for d in events:
        if d["ev"] != "delivery" or not d["accepted"] or not down < d["wall"] < f["up"]:
            continue
        tried = starts.get((d["key"], d["fence"]), [])
        if granted.get((d["resource"], d["fence"]), 0.0) > down or (
                tried and min(tried) > down + OUTAGE_GRACE_SECONDS):
            sent += 1
        else:
            in_flight += 1
    return {**f, "first_admitted": first, "answers": dict(answers), "sent_during": sent,
            "in_flight_landed": in_flight}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=random.SystemRandom().randrange(2**31))
    p.add_argument("--full", action="store_true")
    p.add_argument("--report", default="docs/RELIABILITY.md")
    p.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    a = p.parse_args()
    modes = FULL if a.full else [QUICK]
    runs = [asyncio.run(run(a.seed, m, a.keep)) for m in modes]
    text = markdown(runs, full=a.full, seed=a.seed)
    print(text)
    if a.full:
        write_section(Path(a.report), text)
    sync_ok = all(r.report.ok for r in runs if r.mode.synchronous)
    return 0 if sync_ok else 1


if __name__ == "__main__":
    sys.exit(main())
