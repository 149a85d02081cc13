"""The charts of bench/RESULTS.md, drawn with matplotlib's Agg backend (no
display) as SVG into bench/charts/ (a full ``make bench``) or the folder
BENCH_CHARTS names (anything else: a partial run must not overwrite the
charts RESULTS.md links to).

Text stays text and nothing random or dated goes in the file, so a chart
redrawn from the same numbers is the same file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported: no display here

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, ScalarFormatter

from .cpu import Shares
from .harness import ROOT

plt.rcParams.update({
    "svg.fonttype": "none",  # text as text: small, searchable
    "svg.hashsalt": "fencegate-bench",  # stable ids between runs
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
})

#: one colour per path, the same in every chart
COLOURS = {"direct": "#4c72b0", "bare proxy": "#55a868", "gateway": "#c44e52",
           "pgbench": "#4c72b0", "LeaseClient.claim": "#c44e52"}
SHARE_COLOURS = {"PostgreSQL": "#4c72b0", "gateway": "#c44e52", "sink": "#55a868",
                 "load generator": "#8172b2", "interrupts": "#ccb974",
                 "everything else": "#999999",
                 "idle": "#eeeeee"}

_folder: Path | None = None


def folder(full_run: bool) -> Path:
    """Where charts go in this run (made once)."""
    global _folder
    if _folder is None:
        named = os.environ.get("BENCH_CHARTS")
        _folder = ROOT / "charts" if full_run else \
            Path(named) if named else Path(tempfile.mkdtemp(prefix="fencegate-charts-"))
        _folder.mkdir(parents=True, exist_ok=True)
    return _folder


def _save(fig: Figure, name: str) -> Path:
    assert _folder is not None, "charts.folder() first"
    path = _folder / name
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    return path


def _concurrency_axis(ax: Axes, levels: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(levels))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    ax.set_xlabel("closed-loop callers (log scale)")


def throughput(sweep: dict[str, list[tuple[int, float]]], subtitle: str) -> Path:
    """Requests/s against closed-loop callers, one line per path."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    for path, points in sweep.items():
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=path, color=COLOURS.get(path.split(" --")[0]))
    _concurrency_axis(ax, sorted({c for pts in sweep.values() for c, _ in pts}))
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Throughput against concurrency\n{subtitle}", fontsize=9)
    ax.legend()
    return _save(fig, "throughput.svg")


def latency_cdf(latencies: dict[str, list[float]], load: str, subtitle: str) -> Path:
    """The distribution of latencies, one curve per path (log time axis)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    for path, values in latencies.items():
        ordered = sorted(values)
        n = len(ordered)
        if not n:
            continue
        step = max(1, n // 400)  # enough points to draw the curve, a small file
        keep = [*range(0, n, step), n - 1]
        ax.plot([ordered[i] for i in keep], [(i + 1) / n for i in keep], label=path,
                color=COLOURS.get(path.split(" --")[0]), drawstyle="steps-post")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("latency, ms (log scale)")
    ax.set_ylabel("fraction of requests at or under")
    ax.set_ylim(0, 1.0)
    for q in (0.5, 0.99):
        ax.axhline(q, color="#888888", linewidth=0.6, linestyle=":")
    ax.set_title(f"Latency distribution at moderate load ({load})\n{subtitle}", fontsize=9)
    ax.legend(loc="lower right")
    return _save(fig, "latency-cdf.svg")


def claims(rows: list[tuple[int, float, float]], subtitle: str) -> Path:
    """Claims/s of pgbench and LeaseClient.claim against concurrency, the
    ratio written over each point."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    levels = [c for c, _, _ in rows]
    ax.plot(levels, [b for _, b, _ in rows], marker="o", label="pgbench",
            color=COLOURS["pgbench"])
    ax.plot(levels, [o for _, _, o in rows], marker="o", label="LeaseClient.claim",
            color=COLOURS["LeaseClient.claim"])
    for c, base, ours in rows:
        ax.annotate(f"{ours / base:.2f}x", (c, ours), textcoords="offset points",
                    xytext=(0, -12), ha="center", fontsize=8)
    _concurrency_axis(ax, levels)
    ax.set_xlabel("concurrent clients (log scale)")
    ax.set_ylabel("claims/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Lease claims against pgbench, same statement\n{subtitle}", fontsize=9)
    ax.legend()
    return _save(fig, "claims.svg")


def cpu_shares(rows: list[tuple[str, Shares]], subtitle: str) -> Path:
    """Stacked shares of the machine's CPU during each saturation phase."""
    fig, ax = plt.subplots(figsize=(7.2, 0.4 * len(rows) + 1.4), layout="constrained")
    labels = [label for label, _ in rows]
    left = [0.0] * len(rows)
    parts = ["PostgreSQL", "gateway", "sink", "load generator", "interrupts",
             "everything else", "idle"]
    rest = {"interrupts": lambda s: s.interrupts, "everything else": lambda s: s.other,
            "idle": lambda s: s.idle}
    for part in parts:
        widths = [100 * (rest[part](s) if part in rest else s.groups.get(part, 0.0))
                  for _, s in rows]
        ax.barh(labels, widths, left=left, label=part, color=SHARE_COLOURS[part],
                edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the machine's CPU time during the timed phase")
    ax.grid(axis="y", visible=False)
    ax.set_title(f"Where the CPU goes at saturation\n{subtitle}", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, "cpu-shares.svg")
