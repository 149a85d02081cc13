"""The history checker: what must never happen, whatever the faults.

Pure: it reads a list of events (claims, effect attempts, deliveries at the
sinks, faults, fenced database writes and what the database kept of them) and
the final state of the queue, and answers the violations
and the figures. Times are wall-clock seconds of this one machine: the
database's ``clock_timestamp()`` for grants, the sinks' ``time.time()`` for
deliveries.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from gateway.effects.fingerprint import derived_key, message_id

#: an attempt that started this soon after an outage began may have been
#: admitted just before it
OUTAGE_GRACE_SECONDS = 0.05
#: faults after which another PostgreSQL server is the primary (tests/ha)
FAILOVERS = ("switchover", "failover")


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def provider_key(client: str, kind: str, key: str) -> str:
    """What a sink records for the effect ``key``: the Message-ID, or the
    provider idempotency key."""
    return message_id(client, key) if kind == "smtp" else derived_key(client, key)


Events = list[dict[str, Any]]
Granted = dict[str, list[tuple[int, float]]]


def check(events: Events, *, client: str, final_jobs: dict[str, int] | None = None,
          expected_jobs: int = 0) -> Report:
    report = Report()
    claims = [e for e in events if e["ev"] == "claim"]
    attempts = [e for e in events if e["ev"] == "attempt"]
    deliveries = [e for e in events if e["ev"] == "delivery"]
    outages = [(e["start"], e["end"]) for e in events
               if e["ev"] == "fault" and e.get("db_outage")]
    v = report.violations
    granted = _fences_granted(claims, v)
    duplicates = _duplicates(deliveries, v)
    stale = _stale_deliveries(deliveries, granted, v)
    _expired_let_through(claims, attempts, v)
    _outages(client, attempts, deliveries, outages, v)
    cut = _cut_bodies(attempts, deliveries, v)
    lost = _lost_jobs(final_jobs, expected_jobs, v)
    regressions = _fence_regressions(claims, [e for e in events if e["ev"] == "fault"
                                              and e["kind"] in FAILOVERS], v)
    fenced = check_fenced(events, v)
    cancels = _after_cancels(events, attempts, v)
    refused = Counter(a["code"] for a in attempts if a["status"] != 200)
    report.figures.update({
        "claims": len(claims),
        "attempts": len(attempts),
        "deliveries": sum(1 for d in deliveries if d["accepted"]),
        "resends_deduped_by_provider": sum(1 for d in deliveries if not d["accepted"]),
        "refused": dict(sorted(refused.items())),
        "duplicates": duplicates,
        "stale_deliveries": stale,
        "cut_bodies": cut,
        "lost_jobs": lost,
        "fence_regressions": regressions,
        "jobs": dict(final_jobs or {}),
        **cancels,
        **fenced,
    })
    return report


def _fences_granted(claims: Events, v: list[str]) -> Granted:
    """Fences granted per resource, in fence order, with when; no fence twice,
    and a higher fence never granted before a lower one."""
    granted: Granted = defaultdict(list)
    for c in claims:
        granted[c["resource"]].append((c["fence"], c["granted"]))
    for fences in granted.values():
        fences.sort()
        for (f1, t1), (f2, t2) in itertools.pairwise(fences):
            if f2 == f1:
                v.append(f"fence {f1} was issued twice")
            elif t2 < t1:
                v.append(f"fence {f2} was granted before the lower {f1}")
    return granted


def _duplicates(deliveries: Events, v: list[str]) -> int:
    """1. No key delivered twice (a provider that dedupes 'accepts' once)."""
    accepted = Counter(d["key"] for d in deliveries if d["accepted"])
    duplicates = {k: n for k, n in accepted.items() if n > 1}
    for k, n in sorted(duplicates.items()):
        v.append(f"effect {k} was delivered {n} times")
    return len(duplicates)


def _stale_deliveries(deliveries: Events, granted: Granted, v: list[str]) -> int:
    """2. Every delivery under a fence that was granted and not yet superseded
    (a newer fence granted before the delivery landed breaks the drain barrier)."""
    stale = 0
    for d in deliveries:
        fences = granted.get(d["resource"], [])
        if d["fence"] not in {f for f, _ in fences}:
            stale += 1
            v.append(f"delivery of {d['key']} under fence {d['fence']}, never granted on "
                     f"{d['resource']}")
            continue
        later = fences[bisect.bisect_right(fences, (d["fence"], float("inf"))):]
        newer = [(f, t) for f, t in later if t < d["wall"]]
        if newer:
            stale += 1
            f, t = newer[0]
            v.append(f"delivery of {d['key']} under fence {d['fence']} at {d['wall']:.6f}, "
                     f"after fence {f} was granted at {t:.6f} (drain barrier / stale fence)")
    return stale


def _expired_let_through(claims: Events, attempts: Events, v: list[str]) -> None:
    """3. A lease that expired, unrenewed, lets nothing new through."""
    expiry = {(c["resource"], c["fence"]): c["expires"] for c in claims if not c.get("renews")}
    for a in attempts:
        end = expiry.get((a["resource"], a["fence"]))
        if end is not None and a["t0"] > end and a["status"] == 200 and a["code"] == "ok":
            v.append(f"attempt {a['key']} under fence {a['fence']} started "
                     f"{a['t0'] - end:.3f}s after its lease expired and was let through")


def _outages(client: str, attempts: Events, deliveries: Events,
             outages: list[tuple[float, float]], v: list[str]) -> None:
    """4. While the database is out of reach: 503, and nothing delivered."""
    def inside(a: dict[str, Any]) -> bool:
        return any(s + OUTAGE_GRACE_SECONDS < a["t0"] and a["t1"] < e for s, e in outages)

    for a in attempts:
        if inside(a) and a["status"] not in (503, 0):
            v.append(f"attempt {a['key']} answered {a['status']} {a['code']} while the "
                     "database was unreachable (expected 503)")
    by_effect: dict[tuple[str, int], Events] = defaultdict(list)
    for a in attempts:
        by_effect[(provider_key(client, a["kind"], a["key"]), a["fence"])].append(a)
    for d in deliveries:
        tries = by_effect.get((d["key"], d["fence"]), [])
        if tries and all(inside(a) for a in tries):
            v.append(f"{d['key']} was delivered though every attempt fell in a database "
                     "outage")


def _cut_bodies(attempts: Events, deliveries: Events, v: list[str]) -> int:
    """6. Bodies arrive whole: the request at the provider, the answer (and
    its replay) at the worker."""
    cut = 0
    for d in deliveries:
        if not d.get("whole", True):
            cut += 1
            v.append(f"{d['key']} reached the provider with its body cut")
    for a in attempts:
        if a["status"] == 200 and not a.get("whole", True):
            cut += 1
            v.append(f"attempt {a['key']} got the provider's answer cut ({a['code']})")
    return cut


def _after_cancels(events: Events, attempts: Events, v: list[str]) -> dict[str, Any]:
    """8. Nothing of a job counts after a committed cancel: no attempt of its
    effect sent after the cancel's answer gets through the gateway, and the
    job ends cancelled (never completed, never run again). A cancel that
    found the job finished left it as it was."""
    final = {e["job"]: e["state"] for e in events if e["ev"] == "job_final"}
    cancels = [e for e in events if e["ev"] == "cancel"]
    by_resource = defaultdict(list)
    for a in attempts:
        by_resource[a["resource"]].append(a)
    for c in cancels:
        state = final.get(c["job"])
        if c["cancelled"]:
            if state != "cancelled":
                v.append(f"job {c['job']} was cancelled (it was {c['was']}) but ended {state}")
            for a in by_resource.get(c["resource"], []):
                if a["t0"] > c["answered"] and a["status"] == 200:
                    v.append(f"job {c['job']}: an attempt sent {a['t0'] - c['answered']:.3f}s "
                             f"after its cancel committed got through ({a['code']})")
        elif state == "cancelled":
            v.append(f"job {c['job']}: its cancel found it {c['was']}, yet it ended cancelled")
    return {"cancels": sum(1 for c in cancels if c["cancelled"]),
            "cancels_of_running_jobs": sum(1 for c in cancels if c["was"] == "claimed"),
            "cancels_too_late": sum(1 for c in cancels if not c["cancelled"]),
            "snoozes": sum(1 for e in events if e["ev"] == "snooze")}


def _lost_jobs(final_jobs: dict[str, int] | None, expected: int, v: list[str]) -> int:
    """5. No job lost: at the end, every job completed, dead or cancelled."""
    if final_jobs is None:
        return 0
    lost = sum(final_jobs.get(s, 0) for s in ("queued", "claimed", "scheduled"))
    if lost:
        v.append(f"{lost} jobs neither completed, dead nor cancelled at the end")
    if sum(final_jobs.values()) != expected:
        v.append(f"{expected} jobs enqueued, {sum(final_jobs.values())} found")
    return lost


def _fence_regressions(claims: Events, failovers: Events, v: list[str]) -> int:
    """7. Fences never go back across a failover: every fence granted after
    the new primary took over is above every fence granted before the old one
    stopped, on any resource (each is floored at the database clock, so a
    promoted standby that lost the last commits still issues higher ones)."""
    regressions = 0
    for f in failovers:
        before = [c["fence"] for c in claims if c["granted"] < f["start"]]
        after = [c for c in claims if c["granted"] > f["end"]]
        if not before:
            continue
        highest = max(before)
        below = [c for c in after if c["fence"] <= highest]
        regressions += len(below)
        for c in below[:20]:
            v.append(f"fence {c['fence']} on {c['resource']} granted after the {f['kind']} "
                     f"at {f['end']:.3f} is not above fence {highest} granted before it")
    return regressions


def check_fenced(events: Events, v: list[str]) -> dict[str, Any]:
    """8. Fenced database writes (tests.chaos.fenced), judged by the database's
    own order of grants and commits (``db_order``), the rows it kept
    (``db_write``), its jobs of kind "db" (``db_job``) and each transaction's
    recorded outcome (``fenced``): no write commits under a fence older than
    one already granted for its resource, nor under one never granted; a job
    is completed exactly when its one row is there, the completion naming it;
    nothing refused, or failed before its COMMIT, is in the table, and nothing
    answered as committed is missing."""
    order = sorted((e for e in events if e["ev"] == "db_order"), key=lambda e: e["seq"])
    rows = {e["write_id"]: e for e in events if e["ev"] == "db_write"}
    attempts = [e for e in events if e["ev"] == "fenced"]
    highest: dict[str, int] = {}
    granted: set[tuple[str, int]] = set()
    stale = 0
    for e in order:
        res, fence = e["resource"], e["fence"]
        if e["kind"] == "grant":
            granted.add((res, fence))
            highest[res] = max(highest.get(res, 0), fence)
        elif (res, fence) not in granted:
            stale += 1
            v.append(f"write {e['write_id']} committed (#{e['seq']}) under fence {fence}, "
                     f"never granted on {res}")
        elif fence < highest[res]:
            stale += 1
            v.append(f"write {e['write_id']} committed (#{e['seq']}) under fence {fence} "
                     f"after fence {highest[res]} was granted on {res}")
    committed = {e["write_id"] for e in order if e["kind"] == "commit"}
    for w in sorted(set(rows) ^ committed):
        v.append(f"write {w} is {'in the table but not' if w in rows else 'not in the table but'}"
                 " in the commit order")
    torn = _torn_jobs(events, rows, v)
    outcomes = Counter(f"{a['outcome']} {a['code']}" for a in attempts)
    for a in attempts:
        if a["outcome"] in ("refused", "failed") and a["write_id"] in rows:
            v.append(f"write {a['write_id']} was answered {a['outcome']} ({a['code']}) "
                     "but is in the table")
        elif a["outcome"] == "committed" and a["write_id"] not in rows:
            v.append(f"write {a['write_id']} was answered committed but is not in the table")
    unknown = [a for a in attempts if a["outcome"] == "unknown"]
    return {
        "fenced_attempts": len(attempts),
        "fenced_outcomes": dict(sorted(outcomes.items())),
        "fenced_rows": len(rows),
        "fenced_unknown_committed": sum(1 for a in unknown if a["write_id"] in rows),
        "fenced_unknown": len(unknown),
        "fenced_stale_commits": stale,
        "fenced_torn_jobs": torn,
    }


def _torn_jobs(events: Events, rows: dict[str, dict[str, Any]], v: list[str]) -> int:
    """A job's completion and its business row: both or neither, and one row."""
    by_job: dict[int, list[str]] = defaultdict(list)
    for w, row in rows.items():
        if row["job"] is not None:
            by_job[row["job"]].append(w)
    torn = 0
    jobs = [e for e in events if e["ev"] == "db_job"]
    known = {j["id"] for j in jobs}
    for j in jobs:
        written = by_job.get(j["id"], [])
        done = j["state"] == "completed"
        if len(written) > 1:
            torn += 1
            v.append(f"job {j['id']} has {len(written)} rows: {sorted(written)}")
        elif done and not written:
            torn += 1
            v.append(f"job {j['id']} completed without its row")
        elif written and not done:
            torn += 1
            v.append(f"job {j['id']} is {j['state']} but its row {written[0]} committed")
        elif done and j["result_ref"] != written[0]:
            torn += 1
            v.append(f"job {j['id']} completed naming {j['result_ref']}, its row is "
                     f"{written[0]}")
    for job_id in sorted(set(by_job) - known):
        torn += 1
        v.append(f"rows {by_job[job_id]} name job {job_id}, which is not there")
    return torn
