"""How the effect path scales, and what saturates (section 7 of bench/run.py).

Effects/s through the gateway against ``fencegate serve --workers`` 1, 2, 4,
and against the number of distinct leased resources the effects are spread
over (1, 64, 10,000: effects on one resource serialise on its lease row's
lock, in admission and in the outcome's record). During each timed phase the
CPU seconds of PostgreSQL (the postmaster and its backends), the gateway's
processes, the sink and the load generator are measured (bench/cpu.py), as
shares of the machine.
"""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

from . import charts
from .cpu import CpuMeter, Shares
from .harness import (
    RESOURCES,
    free_port,
    gateway,
    peer,
    postmaster_pid,
    say,
    wait_port,
)
from .loadgen import run_load

#: closed-loop callers of every phase here: enough to keep 4 processes busy
CALLERS = 64
WORKERS = (1, 2, 4)
SPREADS = (1, RESOURCES, 10_000)
GROUPS = ("PostgreSQL", "gateway", "sink", "load generator")


def batches(metrics_url: str) -> dict[str, tuple[float, float]]:
    """The gateway's own count of statements and of the calls they carried,
    by statement (``fencegate_db_batch_size``: admit, finish), from /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    found: dict[str, list[float]] = {}
    for m in _BATCH_LINE.finditer(text):
        found.setdefault(m["statement"], [0.0, 0.0])[m["part"] == "sum"] += float(m["value"])
    return {k: (v[0], v[1]) for k, v in found.items()}


_BATCH_LINE = re.compile(r'^fencegate_db_batch_size_(?P<part>count|sum)\{[^}]*statement="'
                         r'(?P<statement>[a-z]+)"[^}]*\} (?P<value>[0-9.e+]+)$', re.MULTILINE)


class Phase:
    """What one timed phase measured: the load's result, the CPU shares, and
    the gateway's statements (count, calls) by kind, when it has /metrics."""

    def __init__(self, result: dict[str, Any], shares: Shares,
                 statements: dict[str, tuple[float, float]]) -> None:
        self.result, self.shares, self.statements = result, shares, statements

    @property
    def effects(self) -> int:
        return int(self.result["n"] + self.result["errors"])

    def cpu_ms(self, group: str) -> float:
        """CPU milliseconds of ``group`` per effect answered."""
        s = self.shares
        if group not in s.groups or not self.result["n"]:
            return float("nan")
        return float(s.groups[group] * s.seconds * s.cpus * 1000 / self.result["n"])

    def per_statement(self, kind: str) -> float:
        """Calls one statement of ``kind`` carried, on average."""
        count, calls = self.statements.get(kind, (0.0, 0.0))
        return calls / count if count else float("nan")


def measured(spec: dict[str, Any], roots: dict[str, list[int]],
             metrics_url: str | None = None) -> Phase:
    """One load, with the CPU shares of ``roots`` (and of the load generator)
    over its timed phase, and the gateway's statement counts over it."""
    meter = CpuMeter(roots)
    shares: list[Shares] = []
    marks: list[dict[str, tuple[float, float]]] = []

    def start(pid: int) -> None:
        meter.add("load generator", pid)
        if metrics_url:
            marks.append(batches(metrics_url))
        meter.start()

    def end() -> None:
        shares.append(meter.stop())
        if metrics_url:
            marks.append(batches(metrics_url))

    result = run_load(spec, start, end)
    statements = {}
    if len(marks) == 2:
        statements = {k: (c - marks[0].get(k, (0.0, 0.0))[0], n - marks[0].get(k, (0.0, 0.0))[1])
                      for k, (c, n) in marks[1].items()}
    return Phase(result, shares[0], statements)


def _cells(s: Shares) -> str:
    return " | ".join(f"{100 * s.groups[g]:.0f} %" if g in s.groups else "n/a"
                      for g in GROUPS) + \
        f" | {100 * s.interrupts:.0f} % | {100 * s.other:.0f} % | {100 * s.idle:.0f} %"


def at_limit(s: Shares, processes: dict[str, int]) -> str:
    """What the shares say saturates: a group whose processes are each busy a
    whole core, or the machine itself when (nearly) nothing is idle."""
    full = [f"the {g} ({s.groups[g] * s.cpus:.2f} of {n} core{'s' * (n > 1)})"
            for g, n in processes.items() if g in s.groups and s.groups[g] * s.cpus >= 0.9 * n]
    if full:
        return "at its limit: " + ", ".join(full)
    if s.idle < 0.10:
        top = sorted(s.groups, key=lambda g: -s.groups[g])
        return (f"the machine: {100 * s.idle:.0f} % idle; most CPU: " +
                ", ".join(f"{g} {s.groups[g] * s.cpus:.2f} cores" for g in top[:2]))
    return f"no CPU: {100 * s.idle:.0f} % of the machine idle (waits: locks, round trips)"


async def bench_scaling(dsn: str, subtitle: str) -> None:
    say("## 7. Scaling, and what saturates\n")
    say(f"A closed loop of {CALLERS} callers for each timed phase; CPU seconds of each "
        "process tree over that phase, as shares of the whole machine (all CPUs: on 2 "
        "CPUs, 50 % is one core). \"Interrupts\" is the kernel's interrupt and softirq "
        "time, charged to no process (loopback TCP is processed there in part); "
        "\"everything else\" is busy time none of these explain: other users of this "
        "shared machine, this benchmark's driver, time the hypervisor took. For the bare "
        "proxy, the gateway column is the proxy's one process. CPU ms per effect: a "
        "group's CPU time over the phase divided by the effects answered in it. Calls per "
        "statement: the gateway's own count (`fencegate_db_batch_size` on /metrics, read "
        "at both ends of the phase) of admissions or outcome records one statement "
        "carried.\n")
    pg = await postmaster_pid(dsn)
    sink_port, proxy_port, smtp_port = free_port(), free_port(), free_port()
    base_roots: dict[str, list[int]] = {"PostgreSQL": [pg]} if pg else {}
    rows: list[tuple[str, Phase, dict[str, int]]] = []
    spread: list[tuple[int, Phase]] = []
    with peer("sink", sink_port) as sink, \
            peer("proxy", proxy_port, f"http://127.0.0.1:{sink_port}") as bare:
        await wait_port(sink_port)
        await wait_port(proxy_port)
        roots = {**base_roots, "sink": [sink.pid]}
        phase = measured({"kind": "http", "concurrency": CALLERS,
                          "url": f"http://127.0.0.1:{proxy_port}/hook/x"},
                         {**roots, "gateway": [bare.pid]})
        rows.append(("bare proxy (one process)", phase, {"gateway": 1, "load generator": 1}))
        for workers in WORKERS:
            async with gateway(dsn, sink_port, smtp_port, workers) as gw:
                phase = measured({"kind": "http", "concurrency": CALLERS,
                                  "url": f"{gw.url}/v1/http/sink/x", "leases": gw.leases,
                                  "run_id": f"w{workers}-{time.time_ns()}"},
                                 {**roots, "gateway": [gw.proc.pid]}, f"{gw.url}/metrics")
                rows.append((f"gateway --workers {workers}", phase,
                             {"gateway": workers, "load generator": 1}))
        for resources in SPREADS:
            if resources == RESOURCES:  # the same as --workers 1 above: measured once
                spread.append((resources, rows[1][1]))
                continue
            async with gateway(dsn, sink_port, smtp_port, 1, resources=resources) as gw:
                spread.append((resources, measured(
                    {"kind": "http", "concurrency": CALLERS,
                     "url": f"{gw.url}/v1/http/sink/x", "leases": gw.leases,
                     "run_id": f"r{resources}-{time.time_ns()}"},
                    {**roots, "gateway": [gw.proc.pid]}, f"{gw.url}/metrics")))
    one = rows[1][1].result["rps"]
    say(f"### Gateway processes ({RESOURCES} resources)\n")
    say("| path | effects/s | vs --workers 1 | PostgreSQL | gateway | sink | load generator "
        "| interrupts | everything else | idle | PostgreSQL CPU ms per effect | gateway CPU ms "
        "per effect | errors |")
    say("| --- " + "| ---: " * 12 + "|")
    for name, p, _ in rows:
        r = p.result
        say(f"| {name} | {r['rps']:,.0f} | {r['rps'] / one:.2f}x | {_cells(p.shares)} | "
            f"{p.cpu_ms('PostgreSQL'):.2f} | {p.cpu_ms('gateway'):.2f} | {r['errors']} |")
    say()
    for name, p, processes in rows:
        say(f"- {name}: {at_limit(p.shares, processes)}.")
    say()
    base = spread[-1][1]
    say(f"### Distinct leased resources (--workers 1, {CALLERS} callers)\n")
    say("| resources | effects/s | vs 10,000 | p50 ms | p99 ms | PostgreSQL | gateway "
        "| everything else | idle | PostgreSQL CPU ms per effect | admissions per statement "
        "| outcomes per statement | other answers |")
    say("| ---: " + "| ---: " * 11 + "| --- |")
    for resources, p in spread:
        r, s = p.result, p.shares
        other = ", ".join(f"{n:,} {c}" for c, n in sorted(r["codes"].items())) or "none"
        say(f"| {resources:,} | {r['rps']:,.0f} | {r['rps'] / base.result['rps']:.2f}x | "
            f"{r['p50']:.1f} | {r['p99']:.1f} | {_share(s, 'PostgreSQL')} | "
            f"{_share(s, 'gateway')} | {100 * s.other:.0f} % | {100 * s.idle:.0f} % | "
            f"{p.cpu_ms('PostgreSQL'):.2f} | {p.per_statement('admit'):.1f} | "
            f"{p.per_statement('finish'):.1f} | {other} |")
    say()
    hot, wide = spread[0][1], spread[-1][1]
    say(f"One hot resource: {hot.result['rps']:,.0f} effects/s against "
        f"{wide.result['rps']:,.0f} spread over 10,000 "
        f"({hot.result['rps'] / wide.result['rps']:.2f}x), p50 {hot.result['p50']:.1f} against "
        f"{wide.result['p50']:.1f} ms; PostgreSQL CPU per effect {hot.cpu_ms('PostgreSQL'):.2f} "
        f"against {wide.cpu_ms('PostgreSQL'):.2f} ms; "
        f"{at_limit(hot.shares, {'gateway': 1, 'load generator': 1})}.\n")
    shares = [(name.replace(" (one process)", ""), p.shares) for name, p, _ in rows] + \
        [(f"1 worker, {n:,} resource{'s' * (n > 1)}", p.shares) for n, p in spread]
    path = charts.cpu_shares(shares, subtitle)
    say(f"![CPU shares at saturation](charts/{path.name})\n")


def _share(s: Shares, group: str) -> str:
    return f"{100 * s.groups[group]:.0f} %" if group in s.groups else "n/a"
