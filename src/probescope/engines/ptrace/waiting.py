"""A waitpid that wakes up at least every `period` seconds, at no cost per ptrace stop.

waitpid(2) has no timeout. A per-thread POSIX timer (SIGEV_THREAD_ID) sends a real-time signal
to the tracing thread every `period`; the signal's handler is a do-nothing libc function
installed *without* SA_RESTART, so a waitpid blocked in libc returns EINTR and the loop regains
control. Nothing is armed or disarmed per stop. Python's own os.* calls in that thread retry
after EINTR (PEP 475), so only this wait notices the ticks.
"""

from __future__ import annotations

import ctypes
import errno
import signal
import threading

from probescope.errors import PtraceError

_libc = ctypes.CDLL(None, use_errno=True)
_waitpid = _libc.waitpid
_waitpid.restype = ctypes.c_int
_waitpid.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int]

_SIGEV_THREAD_ID = 4
_CLOCK_MONOTONIC = 1


class _SigAction(ctypes.Structure):
    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_uint64 * 16),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


class _SigEvent(ctypes.Structure):
    _fields_ = [
        ("value", ctypes.c_void_p),
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("tid", ctypes.c_int),
        ("_pad", ctypes.c_int * 11),
    ]


class _TimeSpec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("interval", _TimeSpec), ("value", _TimeSpec)]


_lock = threading.Lock()
_tick_signal: int | None = None


def _install_tick_signal() -> int:
    """Pick a free real-time signal and give it a no-op, interrupting handler (once)."""
    global _tick_signal
    with _lock:
        if _tick_signal is not None:
            return _tick_signal
        noop = ctypes.cast(_libc.getppid, ctypes.c_void_p).value
        for number in range(signal.SIGRTMAX - 2, signal.SIGRTMIN + 3, -1):
            old = _SigAction()
            if _libc.sigaction(number, None, ctypes.byref(old)) != 0:
                continue
            if old.handler not in (None, 0):  # taken by someone (SIG_DFL is 0)
                continue
            action = _SigAction()
            action.handler = noop
            action.flags = 0  # no SA_RESTART: blocking calls return EINTR
            if _libc.sigaction(number, ctypes.byref(action), None) == 0:
                _tick_signal = number
                return number
        raise PtraceError("no free real-time signal for the tracer's wait timer")


class InterruptibleWait:
    """waitpid(-1, options) on the calling thread, returning None on each timer tick."""

    def __init__(self, options: int, period: float = 0.1) -> None:
        self.options = options
        self.signal = _install_tick_signal()
        self._status = ctypes.c_int(0)
        self._status_ref = ctypes.byref(self._status)
        self._timer = ctypes.c_void_p(0)
        self._armed = False
        event = _SigEvent()
        event.signo = self.signal
        event.notify = _SIGEV_THREAD_ID
        event.tid = threading.get_native_id()
        if (
            _libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(self._timer))
            != 0
        ):
            raise PtraceError(f"timer_create failed: {errno.errorcode[ctypes.get_errno()]}")
        self._armed = True
        seconds = int(period)
        nanos = int((period - seconds) * 1e9)
        spec = _ITimerSpec(_TimeSpec(seconds, nanos), _TimeSpec(seconds, nanos))
        if _libc.timer_settime(self._timer, 0, ctypes.byref(spec), None) != 0:
            self.close()
            raise PtraceError(f"timer_settime failed: {errno.errorcode[ctypes.get_errno()]}")
        self.closed = False

    def wait(self) -> tuple[int, int] | None:
        """(pid, status), or None when the timer interrupted the wait."""
        pid = _waitpid(-1, self._status_ref, self.options)
        if pid > 0:
            return pid, self._status.value
        err = ctypes.get_errno()
        if err == errno.EINTR:
            return None
        if err == errno.ECHILD:
            raise ChildProcessError(errno.ECHILD, "no child processes")
        raise PtraceError(f"waitpid failed: {errno.errorcode.get(err, err)}")

    def close(self) -> None:
        """Stop the timer (idempotent). The kernel's first timer id is 0, hence the flag."""
        if self._armed:
            _libc.timer_delete(self._timer)
            self._armed = False
        self.closed = True
