"""``make chaos``: zombie trials and a mixed soak under faults, checked, with
the figures written to docs/RELIABILITY.md.

    python -m tests.chaos.run [--seed N] [--trials 1000] [--lanes 4]
                              [--workers 8] [--effects 10000] [--spread 120]
                              [--mixed-rounds 100] [--fenced-trials N (default: --trials)]
                              [--report docs/RELIABILITY.md]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.chaos import fenced, history
from tests.chaos.checker import Report, check
from tests.chaos.cluster import CLIENT, Cluster
from tests.chaos.scenarios import (
    MIXED_RESOURCES,
    MixedStats,
    SoakStats,
    TrialStats,
    mixed_batches,
    soak,
    zombie_trials,
)
from tests.ha.report import kept_section


@dataclass
class Run:
    seed: int
    trials: TrialStats
    mixed: MixedStats
    fenced: fenced.FencedStats
    soak: SoakStats
    report: Report
    seconds: float
    expected_jobs: int


async def run(seed: int, trials: int, lanes: int, workers: int, effects: int,
              spread: float, faults: list[str] | None = None,
              slow_fraction: float = 0.01, soak_limit: float | None = None,
              mixed_rounds: int = 0, fenced_trials: int = 0) -> Run:
    print(f"chaos seed {seed} (replay with --seed {seed})", flush=True)
    rng = random.Random(seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fencegate-chaos-") as tmp:
        cluster = Cluster(Path(tmp), seed, slow_fraction)
        await cluster.start()
        try:
            trial_stats = await zombie_trials(cluster, trials, lanes, rng)
            print(f"zombie trials done: {trial_stats.trials}", flush=True)
            mixed_stats = await mixed_batches(cluster, mixed_rounds, rng)
            print(f"mixed batches done: {mixed_stats.rounds} rounds", flush=True)
            fenced_stats = await fenced.fenced_trials(cluster, fenced_trials, lanes, rng)
            print(f"fenced write trials done: {fenced_stats.trials}", flush=True)
            soak_stats = await soak(cluster, workers, effects, spread, rng, faults,
                                    limit_seconds=soak_limit or spread + 600)
            print(f"soak done in {soak_stats.seconds:.0f}s", flush=True)
            kept = await fenced.database_events(cluster.pg_dsn)
        finally:
            await cluster.close()
        await asyncio.sleep(0.5)  # let the sinks' last lines land
        events = history.read(cluster.history) + kept
    report = check(events, client=CLIENT, final_jobs=soak_stats.final_jobs,
                   expected_jobs=effects)
    return Run(seed, trial_stats, mixed_stats, fenced_stats, soak_stats, report,
               time.monotonic() - started, effects)


def markdown(r: Run) -> str:
    f = r.report.figures
    faults = dict(r.soak.faults)
    faults["zombie (trials)"] = r.trials.trials
    pg = r.soak.pg_recovery_seconds
    lines = [
        "# Reliability: fencegate under faults",
        "",
        f"`make chaos`, seed {r.seed}, on {time.strftime('%Y-%m-%d')}, "
        f"{r.seconds / 60:.1f} minutes. Replay the same fault schedule with "
        f"`python -m tests.chaos.run --seed {r.seed}`.",
        "",
        "Real processes on loopback: PostgreSQL (embedded, stopped and started as a crash "
        "would), the gateway (`fencegate serve`), worker processes using the lease client "
        "and `GatewayClient`, an SMTP sink (dedupes nothing) and an HTTP sink that honours "
        "`Idempotency-Key` for 12 s; a TCP fault proxy between workers and gateway and another "
        "between gateway and PostgreSQL. 1 % of provider answers are delayed past the "
        "gateway's timeout, 1 % of HTTP requests are acted on and then dropped without an "
        "answer, a tenth of the answers come in pieces; HTTP effects use every method and a "
        "fifth are uploaded chunked, every body carrying its hash. Faults between admission "
        "and send: the gateway frozen (SIGSTOP) past an effect's whole deadline, and the SMTP "
        "server slowed until the gateway's two SMTP connections are saturated, each while a "
        "worker whose effect the gateway holds is frozen past its lease; latency and lost "
        "answers (statements that committed) on the gateway's database link. Between the "
        "gateway and the sinks, slow links: slowed to 48 kB/s, or not read at all (a provider "
        "that stops reading), or slowed and the gateway SIGKILLed mid-send, while a tenth of "
        "the HTTP effects carry 300 kB bodies: bytes still in the gateway's kernel when an "
        "attempt ends must never arrive after its drain barrier. A twentieth of the soak's "
        "jobs are cancelled at random moments, racing their completions (nothing of a job may "
        "count after its cancel's answer), and a tenth snooze once. The checker "
        "reads every claim, attempt, delivery and cancel.",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| zombie trials | {r.trials.trials} |",
        f"| mixed-fence batch rounds (requests) | {r.mixed.rounds} ({r.mixed.requests}) |",
        f"| soak effects (jobs) | {r.expected_jobs} |",
        f"| effect attempts | {f['attempts']} |",
        f"| effects delivered | {f['deliveries']} |",
        f"| resends after a timeout, deduped by the provider | "
        f"{f['resends_deduped_by_provider']} |",
        f"| **duplicate deliveries** | **{f['duplicates']}** |",
        f"| **stale deliveries** (fence superseded, or never granted) | "
        f"**{f['stale_deliveries']}** |",
        f"| **bodies cut** (request at the provider, or answer at the worker) | "
        f"**{f['cut_bodies']}** |",
        f"| **lost jobs** (neither completed, dead nor cancelled) | **{f['lost_jobs']}** |",
        f"| cancels racing the workers: counted (of running jobs), too late | "
        f"{f['cancels']} ({f['cancels_of_running_jobs']}), {f['cancels_too_late']} |",
        f"| snoozes from handlers | {f['snoozes']} |",
        f"| fenced database writes (soak jobs and zombie trials) | {f['fenced_attempts']} |",
        f"| **fenced writes committed under a superseded fence** | "
        f"**{f['fenced_stale_commits']}** |",
        f"| **jobs whose completion and row disagree** | **{f['fenced_torn_jobs']}** |",
        f"| violations found by the checker | {len(r.report.violations)} |",
        "",
        "Faults injected:",
        "",
        "| fault | count |",
        "| --- | ---: |",
        *(f"| {k} | {v} |" for k, v in sorted(faults.items())),
        "",
        "Attempts refused, by answer:",
        "",
        "| answer | count |",
        "| --- | ---: |",
        *(f"| {k} | {v} |" for k, v in f["refused"].items()),
        "",
        "Zombie trial outcomes (A: the frozen worker, B: the one that took over):",
        "",
        "| outcome | count |",
        "| --- | ---: |",
        *(f"| {k} | {v} |" for k, v in sorted(r.trials.outcomes.items())),
        "",
        "Mixed batches: each round, a zombie under stale fences and the current holder "
        f"fire at once on the same {MIXED_RESOURCES} resources, so one admission statement "
        "carries both (answers by status and code):",
        "",
        "| answer | count |",
        "| --- | ---: |",
        *(f"| {k} | {v} |" for k, v in sorted(r.mixed.outcomes.items())),
        "",
        *fenced_lines(r),
        "Recovery after each PostgreSQL restart (from its start until the gateway is "
        "ready): " + (", ".join(f"{s:.2f}s" for s in pg) or "none") +
        (f" (median {statistics.median(pg):.2f}s)" if pg else "") + ".",
        "",
        f"Final job states: {f['jobs']}.",
    ]
    if r.report.violations:
        lines += ["", "## Violations", "", *(f"- {v}" for v in r.report.violations[:200])]
    return "\n".join(lines) + "\n"


def fenced_lines(r: Run) -> list[str]:
    f = r.report.figures
    return [
        f"Fenced database writes (tests/chaos/fenced.py): {r.fenced.trials} zombie trials, "
        "each a worker frozen past its lease's ttl before or inside its fenced transaction "
        "(half through `lease.transaction`, half the bare `fencegate_check_fence`) while "
        "another takes the resource over and writes; and the soak's jobs of kind \"db\", "
        "each a row and the job's completion in one `job.transaction`, on a connection "
        "through the database's fault proxy (drops, black holes, answers lost after a "
        "commit) and across the PostgreSQL restarts. The checker reads the database's "
        "own order of grants and commits (a trigger on the leases, a deferred constraint "
        "trigger at each commit). Rows kept: "
        f"{f['fenced_rows']}; COMMITs whose answer was lost: {f['fenced_unknown']} "
        f"({f['fenced_unknown_committed']} of them committed).",
        "",
        "| fenced transaction (A: the frozen worker, B: the one that took over) | count |",
        "| --- | ---: |",
        *(f"| trial {k} | {v} |" for k, v in sorted(r.fenced.outcomes.items())),
        *(f"| all: {k} | {v} |" for k, v in f["fenced_outcomes"].items()),
        "",
    ]


BEFORE_HEADING = "## Before the fix"


def before_section(path: Path) -> str:
    """The "Before the fix" section of ``path`` (with its leading blank line), or ''."""
    text = path.read_text() if path.exists() else ""
    _, found, rest = text.partition("\n" + BEFORE_HEADING)
    if not found:
        return ""
    body, _, _ = rest.partition("\n## ")
    return "\n" + found + body.rstrip("\n") + "\n"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=random.SystemRandom().randrange(2**31))
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--lanes", type=int, default=4)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--effects", type=int, default=10000)
    p.add_argument("--spread", type=float, default=120.0)
    p.add_argument("--mixed-rounds", type=int, default=100)
    p.add_argument("--fenced-trials", type=int, default=None)
    p.add_argument("--report", default="docs/RELIABILITY.md")
    a = p.parse_args()
    r = asyncio.run(run(a.seed, a.trials, a.lanes, a.workers, a.effects, a.spread,
                        mixed_rounds=a.mixed_rounds,
                        fenced_trials=a.trials if a.fenced_trials is None else a.fenced_trials))
    text = markdown(r)
    # kept as they are: the run on the code before the fix (written by hand,
    # from the same command on that commit), and the section `make ha` writes
    report = Path(a.report)
    Path(a.report).write_text(text + before_section(report) + kept_section(report))
    print(text)
    return 0 if r.report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
