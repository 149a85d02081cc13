"""An alarm for a lease's local deadline that a pause cannot outrun.

After a stop-the-world pause (SIGSTOP, a VM freeze, a long GC) or a system
suspend, every event-loop timer that fell due during the pause is due at once,
in the order of their due times: a guarded block's ``sleep(0.01)`` comes
before the keeper's deadline, so the block would run one more step before the
keeper could cancel it.

On Linux the alarm is a timerfd on CLOCK_BOOTTIME (through libc: the os
module has it only from Python 3.13), watched by the event loop like a
socket. It becomes readable the moment the deadline passes (suspend
included), and when the loop next polls, it sees it among the I/O events,
which it handles before the timers that fell due: the lease is declared lost
and the block cancelled before its next step.

One pause escapes that: SIGSTOP. Its SIGCONT interrupts the loop's poll,
and when the poll's own timeout has passed by then, Python's selector (and
libuv, under uvloop) returns no events at all and runs the due timers first.
So the first alarm also installs a SIGCONT handler (only if the process has
none, only from the main thread): Python runs it inside that interrupted
poll (or at the first Python callback under uvloop), before any timer's
callback, and it fires every alarm whose time has passed.

Elsewhere (no timerfd) the alarm falls back to an ordinary loop timer, which
gives the weaker ordering described first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable

from . import clock

_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not clock.COUNTS_SUSPEND:
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.timerfd_create  # noqa: B018 - present only on Linux
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def _timerfd() -> int | None:
    """A non-blocking timerfd on CLOCK_BOOTTIME, or None where there is none."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None or _LIBC is None:
        return None
    fd = int(_LIBC.timerfd_create(boottime, _TFD_NONBLOCK | _TFD_CLOEXEC))
    return fd if fd >= 0 else None


def _arm(fd: int, when: float) -> None:
    """Fire once at ``when`` (seconds on CLOCK_BOOTTIME, i.e. ``clock.now()``)."""
    when = max(when, 1e-9)  # 0 would disarm it
    assert _LIBC is not None
    sec = int(when)
    spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, int((when - sec) * 1e9)))
    if _LIBC.timerfd_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


_armed: weakref.WeakSet[Alarm] = weakref.WeakSet()
_sigcont_installed = False


def _on_sigcont(signum: int, frame: object) -> None:
    """The process was stopped and has just continued: fire every alarm that
    came due meanwhile, before the event loop runs anything else."""
    for alarm in list(_armed):
        alarm.fire_if_due()


def _install_sigcont() -> None:
    global _sigcont_installed
    if _sigcont_installed or threading.current_thread() is not threading.main_thread():
        return
    _sigcont_installed = True
    try:
        if signal.getsignal(signal.SIGCONT) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGCONT, _on_sigcont)  # continuing stays the default
    except (ValueError, OSError, AttributeError):  # no SIGCONT here, or not allowed
        pass


class Alarm:
    """Calls ``callback`` once, at the first moment ``clock.now() >= when``.

    ``set(when)`` moves it (a renewal pushes the deadline out); ``close()``
    cancels it. Use from the event loop's thread only."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._callback = callback
        self._fd = _timerfd()
        self._handle: asyncio.TimerHandle | None = None
        self._when = float("inf")
        self._done = False
        if self._fd is not None:
            self._loop.add_reader(self._fd, self._fired)
        _install_sigcont()
        _armed.add(self)

    def set(self, when: float) -> None:
        if self._done:
            return
        self._when = when
        if self._fd is not None:
            _arm(self._fd, when)
            return
        if self._handle is not None:
            self._handle.cancel()
        delay = max(0.0, when - clock.now())
        self._handle = self._loop.call_at(self._loop.time() + delay, self._fired)

    def fire_if_due(self) -> None:
        """Fire now if the time has come (from the SIGCONT handler)."""
        if not self._done and clock.now() >= self._when:
            self.close()
            self._callback()

    def _fired(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(BlockingIOError):
                os.read(self._fd, 8)
        if self._done:
            return
        if clock.now() < self._when:  # moved out since it was armed
            self.set(self._when)
            return
        self.close()
        self._callback()

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        _armed.discard(self)
        if self._handle is not None:
            self._handle.cancel()
        if self._fd is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
