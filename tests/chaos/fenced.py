"""Fenced database writes under the chaos run's faults (issue 26, "Proof").

Workers write to PostgreSQL in their own transactions, fenced by their lease
(``lease.transaction(conn)``, or the bare ``fencegate_check_fence`` a worker in
another language would call) or by their job (``job.transaction(conn)`` with
the completion in the same commit). Each attempted transaction is recorded with
its outcome: ``committed``, ``refused`` (FG412, or the lease known lost here:
rolled back), ``failed`` (an error before COMMIT was sent: rolled back) or
``unknown`` (COMMIT sent, no answer: the database decides).

The database records its own order: a grant of a new fence (a trigger on
``fencegate_leases``) and each write's commit (a deferred constraint trigger,
which runs at COMMIT under every lock the transaction holds) take the next
number of one sequence. Read back at the end, with the written rows and the
jobs, they are what the checker judges (``checker.check_fenced``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from leases import FenceRefused, Job, Lease, LeaseLost, Queue
from leases.fenced import refusal
from tests.chaos.history import Recorder

#: the business table, and the database's order of grants and commits
SCHEMA = """
CREATE TABLE chaos_writes (
    write_id text   PRIMARY KEY,
    resource text   NOT NULL,
    fence    bigint NOT NULL,
    job      bigint
);
CREATE TABLE chaos_order (
    seq      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind     text   NOT NULL CHECK (kind IN ('grant', 'commit')),
    resource text   NOT NULL,
    fence    bigint NOT NULL,
    write_id text
);
CREATE FUNCTION chaos_write_commits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_order (kind, resource, fence, write_id)
    VALUES ('commit', NEW.resource, NEW.fence, NEW.write_id);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER chaos_write_commits AFTER INSERT ON chaos_writes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION chaos_write_commits();
CREATE FUNCTION chaos_fence_granted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fence IS DISTINCT FROM OLD.fence THEN
        INSERT INTO chaos_order (kind, resource, fence) VALUES ('grant', NEW.resource, NEW.fence);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_fence_granted AFTER INSERT OR UPDATE OF fence ON fencegate_leases
    FOR EACH ROW EXECUTE FUNCTION chaos_fence_granted();
"""

INSERT = "INSERT INTO chaos_writes (write_id, resource, fence, job) VALUES ($1, $2, $3, $4)"
#: every statement of a fenced transaction answers within this, or its outcome
#: is unknown (a lost answer to COMMIT would otherwise wait for ever)
COMMAND_TIMEOUT = 2.0
#: what a dropped, restarted or timed-out connection raises
BROKEN = (OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
          asyncpg.ConnectionDoesNotExistError, asyncpg.IdleInTransactionSessionTimeoutError,
          asyncpg.AdminShutdownError, asyncpg.CannotConnectNowError)


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
    finally:
        await conn.close()


# ---- the writers (in the worker processes) ---------------------------------------


async def write(rec: Recorder, owner: str, dsn: str, resource: str, fence: int, *,
                lease: Lease | None = None, job: Job | None = None, queue: Queue | None = None,
                before: float = 0.0, inside: float = 0.0, working: bool = False
                ) -> tuple[str, str]:
    """One fenced transaction writing one row under (resource, fence): through
    ``lease.transaction`` (or ``job.transaction``, completing the job in it), or,
    given neither, the bare SQL check. ``before`` stalls ahead of it, ``inside``
    stalls in it after the check (``working``: a statement that long, else idle).
    Records and answers (outcome, code)."""
    write_id = f"{resource}@{fence}"
    t0 = time.time()
    outcome, code = "failed", ""
    at_commit = False
    conn: asyncpg.Connection | None = None
    try:
        await asyncio.sleep(before)
        conn = await asyncpg.connect(dsn, timeout=COMMAND_TIMEOUT,
                                     command_timeout=COMMAND_TIMEOUT)
        fenced = job or lease
        block = fenced.transaction(conn) if fenced is not None else conn.transaction()
        async with block:
            if fenced is None:
                await conn.execute("SELECT fencegate_check_fence($1, $2)", resource, fence)
            if inside:
                if working:
                    await conn.execute("SELECT pg_sleep($1)", inside)
                else:
                    await asyncio.sleep(inside)
            await conn.execute(INSERT, write_id, resource, fence, job.id if job else None)
            if job is not None and queue is not None:
                await queue.complete(job, write_id, connection=conn)
            at_commit = True
        outcome, code = "committed", "ok"
    except LeaseLost as lost:  # FenceRefused, or known lost here: nothing sent commits
        outcome = "refused"
        code = lost.code if isinstance(lost, FenceRefused) else "lost_here"
    except asyncpg.PostgresError as e:
        refused = refusal(e, resource, fence)
        if refused is not None:
            outcome, code = "refused", refused.code
        else:
            outcome, code = ("unknown" if at_commit else "failed"), type(e).__name__
    except (*BROKEN, asyncio.CancelledError) as e:  # cancelled: the worker lost the lease
        outcome, code = ("unknown" if at_commit else "failed"), type(e).__name__
        if isinstance(e, asyncio.CancelledError):
            raise
    except Exception as e:  # anything else: still answered, and named
        outcome, code = ("unknown" if at_commit else "failed"), f"{type(e).__name__}: {e}"
    finally:
        if conn is not None:
            conn.terminate()
        rec.record("fenced", owner=owner, write_id=write_id, resource=resource, fence=fence,
                   job=job.id if job else None, t0=t0, t1=time.time(), outcome=outcome,
                   code=code)
    return outcome, code


async def job_write(rec: Recorder, owner: str, queue: Queue, job: Job) -> str:
    """A soak job of kind "db": its row and its completion in one fenced
    transaction, on a connection through the database's fault proxy (its
    drops, black holes and lost answers after a commit). Anything but a
    commit raises, so the worker records a failed attempt (refused if the job
    completed after all) and the job runs again: never completed without its
    row."""
    outcome, code = await write(rec, owner, os.environ["CHAOS_DATABASE_URL"], job.resource,
                                job.fence, job=job, queue=queue)
    if outcome != "committed":
        raise RuntimeError(f"fenced write of job {job.id}: {outcome} {code}")
    return "written"


# ---- zombie trials on fenced writes (in the orchestrator) ----------------------------

#: a fenced zombie's ttl: short, so trials are quick
FENCED_TTL = 0.4
@dataclass
class FencedStats:
    trials: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


async def fenced_trial(dsn: str, a: Any, b: Any, name: str, rng: random.Random,
                       stats: FencedStats) -> None:
    """A claims and starts a fenced write, stalling before it or inside it; A
    is frozen (SIGSTOP) at a random point, past its ttl; usually B takes the
    resource over while A is still frozen (its claim ends A's open
    transaction once A's lease has expired, wherever A stalled: idle, or
    mid-statement) and writes under the new fence; A is thawed and carries
    on. Half of A's writes use the bare SQL check (no local lease check, as a
    worker in another language), half ``lease.transaction``."""
    resource = f"acct:{name}"
    claimed = await asyncio.wait_for(a.call(op="claim", resource=resource, ttl=FENCED_TTL), 30)
    assert claimed["fence"] is not None, "a fresh resource must be free"
    before, inside = rng.choice([(0.0, 0.0), (0.0, 0.15), (0.0, 0.3), (0.1, 0.1)])
    written_a = a.call(op="write", resource=resource, fence=claimed["fence"],
                       api=rng.random() < 0.5, before=before, inside=inside,
                       working=rng.random() < 0.5)
    await asyncio.sleep(rng.uniform(0, before + inside + 0.05))
    os.kill(a.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(max(0.0, claimed["expires"] - time.time()) + rng.uniform(0.05, 0.3))
        if rng.random() < 0.7:
            fence_b, got = None, {}
            for _ in range(400):  # held back while A's transaction is open
                got = await asyncio.wait_for(b.call(op="claim", resource=resource, ttl=5), 30)
                fence_b = got["fence"]
                if fence_b is not None:
                    break
                await asyncio.sleep(0.025)
            assert fence_b is not None, \
                f"{resource}: B never got the resource ({got}; {await holders(dsn, resource)})"
            answer_b = await asyncio.wait_for(
                b.call(op="write", resource=resource, fence=fence_b, api=True), 30)
            stats.outcomes[f"B {answer_b['outcome']} {answer_b['code']}"] += 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(a.pid, signal.SIGCONT)
    answer_a = await asyncio.wait_for(written_a, 30)
    stats.outcomes[f"A {answer_a['outcome']} {answer_a['code']}"] += 1
    stats.trials += 1


async def fenced_trials(cluster: Any, trials: int, lanes: int,
                        rng: random.Random) -> FencedStats:
    from tests.chaos.scenarios import LaneWorker

    stats = FencedStats()
    seeds = [rng.randrange(2**32) for _ in range(lanes)]

    async def lane(index: int) -> None:
        lane_rng = random.Random(seeds[index])
        a = await LaneWorker.spawn(cluster, f"fenced{index}-a")
        b = await LaneWorker.spawn(cluster, f"fenced{index}-b")
        try:
            for t in range(index, trials, lanes):
                await fenced_trial(cluster.pg_dsn, a, b, f"f{t}", lane_rng, stats)
        finally:
            await a.close()
            await b.close()

    if trials:
        await asyncio.gather(*(lane(i) for i in range(min(lanes, trials))))
    return stats


async def holders(dsn: str, resource: str) -> list[dict[str, Any]]:
    """The lease row, and every session holding a lock in the database, for a
    takeover that never came."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetch("SELECT * FROM fencegate_leases WHERE resource = $1", resource)
        held = await conn.fetch(
            "SELECT a.pid, a.state, a.xact_start::text, a.state_change::text, a.query,"
            " l.locktype, l.mode, l.granted FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
            " AND l.locktype IN ('tuple', 'transactionid')")
        return [dict(r) for r in [*row, *held]]
    finally:
        await conn.close()


# ---- what the database kept ---------------------------------------------------------


async def database_events(dsn: str) -> list[dict[str, Any]]:
    """The database's order of grants and commits, the rows written and the
    jobs of kind "db", as history events for the checker."""
    conn = await asyncpg.connect(dsn)
    try:
        order = await conn.fetch("SELECT seq, kind, resource, fence, write_id FROM chaos_order"
                                 " ORDER BY seq")
        writes = await conn.fetch("SELECT write_id, resource, fence, job FROM chaos_writes")
        jobs = await conn.fetch("SELECT id, state, result_ref FROM fencegate_jobs"
                                " WHERE payload->>'kind' = 'db'")
    finally:
        await conn.close()
    end = time.time()
    return [*({"ev": "db_order", "wall": end, **dict(r)} for r in order),
            *({"ev": "db_write", "wall": end, **dict(r)} for r in writes),
            *({"ev": "db_job", "wall": end, **dict(r)} for r in jobs)]
