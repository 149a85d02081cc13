"""The HA run's figures as Markdown, and their place in docs/RELIABILITY.md:
the section ``## High availability`` at the end of the file, replaced whole
by each full run and kept by `make chaos`, which writes the rest."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.ha.run import HARun

HEADING = "## High availability"


def write_section(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else ""
    head = text.split("\n" + HEADING, 1)[0].rstrip("\n")
    path.write_text(head + "\n\n" + section)


def kept_section(path: Path) -> str:
    """The HA section of ``path`` (with its leading blank line), or ''."""
    text = path.read_text() if path.exists() else ""
    _, found, rest = text.partition("\n" + HEADING)
    return "\n" + found + rest if found else ""


def _seconds(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f} s"


def failure_rows(r: HARun) -> list[str]:
    rows = []
    for i, f in enumerate(r.per_failure, 1):
        what = ("switchover (`patronictl switchover`)" if f["kind"] == "switchover"
                else f"hard failover (SIGKILL), standbys {f.get('lag', 0):g} s behind")
        first = f["first_admitted"]
        answers = ", ".join(f"{n} x {k}" for k, n in sorted(f["answers"].items())) or "none"
        rows.append(
            f"| {i} | {what} | {f['from']} → {f['to']} | "
            f"{_seconds(f['up'] - f['down'])} | "
            f"{_seconds(None if first is None else first - f['down'])} | {answers} | "
            f"{f['sent_during']} | {f['in_flight_landed']} |")
    return rows


def run_section(r: HARun) -> list[str]:
    fig = r.report.figures
    label = "Synchronous" if r.mode.synchronous else "Asynchronous"
    m = r.mode
    lines = [
        f"### {label} replication",
        "",
        f"{m.effects} soak effects (jobs) spread over {m.spread:.0f} s, {m.workers} worker "
        f"processes, {m.lanes} lanes of zombie trials; {r.seconds / 60:.1f} minutes.",
        "",
        "| # | failure | primary | no writable primary | stop → first admitted effect "
        "| answers meanwhile | sent meanwhile | in flight at the stop, landed meanwhile |",
        "| ---: | --- | --- | ---: | ---: | --- | ---: | ---: |",
        *failure_rows(r),
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| effect attempts | {fig['attempts']} |",
        f"| effects delivered | {fig['deliveries']} |",
        f"| fences granted (claims recorded) | {fig['claims']} |",
        f"| **duplicate deliveries** | **{fig['duplicates']}** |",
        f"| **stale deliveries** (fence superseded, or never granted) | "
        f"**{fig['stale_deliveries']}** |",
        f"| **fence regressions** (granted after a failover, not above every fence "
        f"before it) | **{fig['fence_regressions']}** |",
        f"| **lost jobs** (neither completed nor dead) | **{fig['lost_jobs']}** |",
        f"| bodies cut | {fig['cut_bodies']} |",
        f"| violations found by the checker | {len(r.report.violations)} |",
        "",
        f"Final job states: {fig['jobs']}. Attempts refused, by answer: "
        + ", ".join(f"{k} {v}" for k, v in fig["refused"].items()) + ".",
        "",
        "Zombie trials: " + ", ".join(f"{k}: {v}" for k, v in sorted(r.trials.items())) + ".",
    ]
    if r.report.violations:
        lines += ["", "Violations:", "", *(f"- {v}" for v in r.report.violations[:30])]
        if len(r.report.violations) > 30:
            lines.append(f"- … and {len(r.report.violations) - 30} more")
    return lines


def markdown(runs: list[HARun], *, full: bool, seed: int, extra: Any = None) -> str:
    cmd = "make ha HA_ARGS=--full" if full else "make ha"
    lines = [
        HEADING,
        "",
        f"`{cmd}`, seed {seed}, on {time.strftime('%Y-%m-%d')} (replay: "
        f"`python -m tests.ha.run{' --full' if full else ''} --seed {seed}`; the seed fixes "
        "the workload and the zombie trials, not the moments Patroni acts).",
        "",
        "Real processes on loopback: etcd 3.4 (Debian's `etcd-server`); three PostgreSQL 15 "
        "members (Debian's `postgresql-15` binaries), each managed by Patroni 4 (PyPI, the "
        "`ha` extra) with its own data directory and port, `synchronous_mode` on or off, "
        "Patroni's ttl 20 s (its minimum) and loop_wait 2 s; HAProxy 2.6 sending connections "
        "to the member whose Patroni answers `GET /primary` with 200 (the holder of the "
        "leader key), checked every 250 ms, sessions of a member marked down cut; PgBouncer "
        "1.18 in transaction mode in front of HAProxy. Three `fencegate serve` processes, "
        "two through HAProxy and one through PgBouncer (DSN `?statement_cache_size=0`). The "
        "chaos suite's workload: soak workers (`leases.Worker` and `GatewayClient`, each on "
        "a gateway of its own, half with their lease client through PgBouncer) and lanes of "
        "zombie trials (A frozen past its 0.4 s lease around its send, B takes over), an "
        "SMTP sink that dedupes nothing and an HTTP sink that honours `Idempotency-Key`; "
        "the chaos checker reads every claim, attempt and delivery. Nothing is restarted "
        "after a failure except the killed member (5 s later, it rejoins as a replica, "
        "rewound if it diverged): gateways and workers reconnect by themselves.",
        "",
        "Columns: *no writable primary*: from the first poll (every 50 ms, each member "
        "asked directly) that found none to the last one; *stop → first admitted effect*: "
        "from the kill, or from the old primary's stop after the switchover command, to the "
        "first effect admitted after it and answered 200 at a worker (it includes HAProxy's "
        "health check and the gateways' pools finding their connections dead); *answers "
        "meanwhile*: every answer to attempts started after the stop and answered while no "
        "primary was writable; *sent "
        "meanwhile*: deliveries at the sinks, while no primary was writable, of effects "
        "admitted after the stop (a fence granted after it, or every attempt started after "
        "it); *in flight at the stop*: deliveries meanwhile of effects admitted before it "
        "(the sink acts up to 0.8 s late), which is allowed. A hard failover first holds "
        "the leader's WAL senders (SIGSTOP) for the lag shown, then kills the leader with "
        "them: standbys that are behind, as over a congested link (on loopback they are "
        "otherwise microseconds behind, and a kill finds nothing unreplicated). With "
        "synchronous replication the same hold stalls every commit instead.",
        "",
    ]
    for r in runs:
        lines += [*run_section(r), ""]
    if len(runs) > 1:
        lines += ["### What the two runs say", "", *comparison(runs), ""]
    return "\n".join(lines)


def comparison(runs: list[HARun]) -> list[str]:
    out = []
    for r in runs:
        fig = r.report.figures
        label = "synchronous" if r.mode.synchronous else "asynchronous"
        broke = [f"{fig[k]} {name}" for k, name in (
            ("duplicates", "duplicate deliveries"), ("stale_deliveries", "stale deliveries"),
            ("fence_regressions", "fence regressions"), ("lost_jobs", "lost jobs"))
            if fig[k]]
        others = len(r.report.violations)
        out.append(f"- With {label} replication the checker found "
                   + (", ".join(broke) if broke else "nothing")
                   + (f" ({others} violations in all)" if others else "") + ".")
    out.append("- The requirement in docs/operations.md (synchronous replication, and a "
               "failover that promotes only a synchronous standby) rests on these runs; "
               "fences kept rising in both, as the clock floor promises.")
    return out
