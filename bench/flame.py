"""A flame graph of the gateway's effect path at saturation:
``python -m bench.run flame`` (``make bench-flame``).

One ``fencegate serve`` process, an HTTP sink, a closed loop of 32 callers
(the saturation phase of section 2). Once the load generator has warmed up,
``py-spy record`` attaches to the gateway for the timed phase
(BENCH_FLAME_SECONDS, default 10: about 800 samples) and writes
``bench/flame-<label>.svg``, BENCH_FLAME_LABEL naming it (default
``latest``). ``flame-before.svg`` is the effect path before issue 11's
hot-path work; make the after with ``BENCH_FLAME_LABEL=after make bench-flame``.

py-spy reads the process's memory with ptrace (root, or CAP_SYS_PTRACE) and
stops it briefly for each sample (100 a second), so the throughput it prints
is a little under an unprofiled run's: read the graph's proportions, not
that number.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .harness import PY, ROOT, free_port, fresh_database, gateway, peer, say, wait_port
from .loadgen import run_load

CALLERS = 32
FLAME_SECONDS = float(os.environ.get("BENCH_FLAME_SECONDS", "10"))


def py_spy() -> str:
    here = Path(PY).parent / "py-spy"  # the virtual environment's, from the bench extra
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        sys.exit("py-spy is not installed: make bench-flame installs the bench extra")
    return found


async def flame(server_dsn: str) -> Path:
    label = os.environ.get("BENCH_FLAME_LABEL", "latest")
    out = ROOT / f"flame-{label}.svg"
    dsn = await fresh_database(server_dsn)
    sink_port, smtp_port = free_port(), free_port()
    recorder: list[subprocess.Popen[bytes]] = []

    def record(_loadgen_pid: int) -> None:
        recorder.append(subprocess.Popen(
            [py_spy(), "record", "--pid", str(gw.proc.pid), "--duration",
             str(max(1, round(FLAME_SECONDS))), "--rate", "100", "--format", "flamegraph",
             "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

    with peer("sink", sink_port):
        await wait_port(sink_port)
        async with gateway(dsn, sink_port, smtp_port, 1) as gw:
            r = run_load({"kind": "http", "concurrency": CALLERS, "seconds": FLAME_SECONDS,
                          "url": f"{gw.url}/v1/http/sink/x", "leases": gw.leases,
                          "run_id": f"flame-{time.time_ns()}"}, record)
            _, err = recorder[0].communicate(timeout=FLAME_SECONDS + 60)
    if recorder[0].returncode != 0 or not out.exists():
        sys.exit(f"py-spy failed ({recorder[0].returncode}): {err.decode(errors='replace')}")
    say(f"wrote {out.relative_to(ROOT.parent)}: gateway --workers 1, {CALLERS} callers, "
        f"{r['rps']:,.0f} effects/s while profiled ({r['errors']} errors)")
    return out
