"""From the TSC the stubs record to CLOCK_MONOTONIC nanoseconds.

The stubs read the time with `rdtsc` (a vDSO clock_gettime would cost them ~25 ns more per
hit). The engine relates the two clocks by reading both in its own process: the TSC through
the `read_tsc` template (bytes from templates.py, mapped read+execute after they are copied,
never writable and executable at once), CLOCK_MONOTONIC through time.monotonic_ns(). The pair
from attach and the latest pair give the rate; the conversion is refreshed at every drain, so
its error stays at the sampling jitter over the session's length. Requires an invariant TSC
(`constant_tsc` and `nonstop_tsc`), which `tsc_problem()` checks.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

from probescope.engines.fentry.templates import TEMPLATES

_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_PRIVATE, _MAP_ANONYMOUS = 0x02, 0x20
_PAGE = 4096


def tsc_problem(cpuinfo: str | None = None) -> str | None:
    """Why the TSC cannot time events here, or None."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return "cannot read /proc/cpuinfo"
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    missing = [f for f in ("constant_tsc", "nonstop_tsc", "rdpid", "fsgsbase") if f not in flags]
    if missing:
        return f"the CPU lacks {', '.join(missing)}, which the fentry stubs rely on"
    return None


def _tsc_reader() -> Callable[[], int]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    ]  # fmt: skip
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    code = TEMPLATES["read_tsc"].code
    address = libc.mmap(None, _PAGE, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap for the TSC reader failed")
    ctypes.memmove(address, code, len(code))
    if libc.mprotect(address, _PAGE, _PROT_READ | _PROT_EXEC) != 0:
        raise OSError(ctypes.get_errno(), "mprotect for the TSC reader failed")
    return ctypes.CFUNCTYPE(ctypes.c_uint64)(address)


class TscClock:
    """TSC ticks → CLOCK_MONOTONIC ns, calibrated in this process."""

    def __init__(self) -> None:
        self._read = _tsc_reader()
        self._tsc0, self._ns0 = self._pair()
        time.sleep(0.002)
        self._rate = 1.0
        self.refresh()

    def _pair(self) -> tuple[int, int]:
        """(tsc, monotonic ns) read as close together as this process can."""
        best: tuple[int, int, int] | None = None
        read = self._read
        for _ in range(5):
            before = time.monotonic_ns()
            tsc = read()
            after = time.monotonic_ns()
            if best is None or after - before < best[0]:
                best = (after - before, tsc, (before + after) // 2)
        assert best is not None
        return best[1], best[2]

    def refresh(self) -> None:
        tsc, ns = self._pair()
        if tsc > self._tsc0:
            self._rate = (ns - self._ns0) / (tsc - self._tsc0)

    def now_tsc(self) -> int:
        return int(self._read())

    def to_ns(self, tsc: int) -> int:
        return self._ns0 + int((tsc - self._tsc0) * self._rate)

    def converter(self) -> Callable[[int], int]:
        """A fast tsc → ns function with the current rate."""
        ns0, tsc0, rate = self._ns0, self._tsc0, self._rate
        return lambda tsc: ns0 + int((tsc - tsc0) * rate)

    def line(self) -> tuple[int, int, float]:
        """(ns0, tsc0, rate): ns = ns0 + (tsc - tsc0) * rate, for code that inlines it."""
        return self._ns0, self._tsc0, self._rate
