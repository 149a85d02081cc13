"""CPU seconds of process trees over one timed phase, as shares of the machine.

``CpuMeter({"gateway": [pid], ...})``: ``start()`` when the phase begins,
``stop()`` when it ends; each group counts its roots and every descendant
(``fencegate serve --workers N`` is a supervisor and N children; PostgreSQL
is the postmaster and one backend per connection, plus its own background
processes). A process that starts during the phase counts from zero; one
that ends during it is counted once its parent in the tree has reaped it
(a backend whose client closed its connection, in the postmaster's
children's times), and lost if its parent is not in the tree.

A share is CPU seconds over the machine's capacity in the phase (every
CPU's time, as /proc/stat counts it), so 50 % on two cores is one core.
"interrupts" is the kernel's interrupt and softirq time, which no process is
charged for (loopback TCP is processed there, in part); "everything else" is
the machine's busy time the rest does not explain: other users of this
machine, the benchmark's driver, time the hypervisor took (steal).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import psutil


def _tree(roots: list[int]) -> list[psutil.Process]:
    procs: list[psutil.Process] = []
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            procs.append(root)
            procs.extend(root.children(recursive=True))
    return procs


def _cpu_seconds(proc: psutil.Process) -> float | None:
    """Its own CPU seconds and those of its children it has reaped: a
    PostgreSQL backend that ends within the phase (a client that closed its
    connection) is counted in the postmaster's."""
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return None
    return float(t.user + t.system + t.children_user + t.children_system)


@dataclass(frozen=True)
class Shares:
    """Shares of the machine (0..1) over one phase, by group, with the rest."""

    groups: dict[str, float]
    interrupts: float
    other: float
    idle: float
    seconds: float
    cpus: int

    def busiest(self) -> str:
        return max(self.groups, key=lambda g: self.groups[g])


class CpuMeter:
    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = dict(groups)
        self._start: dict[tuple[str, int, float], float] = {}
        self._machine: Any = None

    def add(self, group: str, pid: int) -> None:
        """One more root, known only once the phase is about to start (the
        load generator)."""
        self.groups.setdefault(group, []).append(pid)

    def _sample(self) -> dict[tuple[str, int, float], float]:
        seen: dict[tuple[str, int, float], float] = {}
        for group, roots in self.groups.items():
            for proc in _tree(roots):
                cpu = _cpu_seconds(proc)
                with contextlib.suppress(psutil.Error):
                    # (pid, creation time): a pid reused within the phase is another process
                    key = (group, proc.pid, proc.create_time())
                    if cpu is not None:
                        seen[key] = cpu
        return seen

    def start(self) -> None:
        self._machine = psutil.cpu_times()
        self._start = self._sample()

    def stop(self) -> Shares:
        end = self._sample()
        machine = psutil.cpu_times()
        assert self._machine is not None, "stop() before start()"
        before = self._machine
        total = sum(machine) - sum(before)
        # guest time is counted inside user already (proc(5)): not twice
        for field in ("guest", "guest_nice"):
            total -= getattr(machine, field, 0.0) - getattr(before, field, 0.0)
        def delta(*fields: str) -> float:
            return sum(getattr(machine, f, 0.0) - getattr(before, f, 0.0) for f in fields)

        idle = delta("idle", "iowait")
        interrupts = delta("irq", "softirq")
        # totals, not per process: one that ended within the phase is in its
        # parent's reaped children at the end, so its start is taken off here
        used: dict[str, float] = dict.fromkeys(self.groups, 0.0)
        for key, cpu in end.items():
            used[key[0]] += cpu
        for key, cpu in self._start.items():
            used[key[0]] -= cpu
        total = max(total, 1e-9)
        groups = {g: max(0.0, s) / total for g, s in used.items()}
        other = max(0.0, (total - idle - interrupts) / total - sum(groups.values()))
        cpus = psutil.cpu_count() or 1
        return Shares(groups, interrupts / total, other, idle / total, total / cpus, cpus)
