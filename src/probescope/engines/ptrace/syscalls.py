"""The ptrace, wait and cross-process memory system calls, reached through libc with ctypes.

Everything here is a thin, allocation-free wrapper: the engine calls these once or several times
per breakpoint hit, so each keeps its ctypes objects prepared in advance. Errors become
PtraceError with the request name, the thread id and the errno text.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Final

from probescope.errors import PtraceError

PTRACE_PEEKDATA: Final = 2
PTRACE_POKEDATA: Final = 5
PTRACE_CONT: Final = 7
PTRACE_SINGLESTEP: Final = 9
PTRACE_DETACH: Final = 17
PTRACE_SETOPTIONS: Final = 0x4200
PTRACE_GETEVENTMSG: Final = 0x4201
PTRACE_GETSIGINFO: Final = 0x4202
PTRACE_GETREGSET: Final = 0x4204
PTRACE_SETREGSET: Final = 0x4205
PTRACE_SEIZE: Final = 0x4206
PTRACE_INTERRUPT: Final = 0x4207
PTRACE_LISTEN: Final = 0x4208
PTRACE_GETSIGMASK: Final = 0x420A
PTRACE_SETSIGMASK: Final = 0x420B

PTRACE_O_TRACEFORK: Final = 0x2
PTRACE_O_TRACEVFORK: Final = 0x4
PTRACE_O_TRACECLONE: Final = 0x8
PTRACE_O_TRACEEXEC: Final = 0x10
PTRACE_O_TRACEVFORKDONE: Final = 0x20
PTRACE_O_TRACEEXIT: Final = 0x40

PTRACE_EVENT_FORK: Final = 1
PTRACE_EVENT_VFORK: Final = 2
PTRACE_EVENT_CLONE: Final = 3
PTRACE_EVENT_EXEC: Final = 4
PTRACE_EVENT_VFORK_DONE: Final = 5
PTRACE_EVENT_EXIT: Final = 6
PTRACE_EVENT_STOP: Final = 128

NT_PRSTATUS: Final = 1

WALL: Final = 0x40000000  # __WALL: clones and non-clones alike
WNOTHREAD: Final = 0x20000000  # __WNOTHREAD: only this thread's children and tracees

SI_KERNEL: Final = 0x80
TRAP_BRKPT: Final = 1
TRAP_TRACE: Final = 2

# Tracee options: never PTRACE_O_EXITKILL, the tracee must outlive its tracer.
SEIZE_OPTIONS: Final = (
    PTRACE_O_TRACECLONE
    | PTRACE_O_TRACEFORK
    | PTRACE_O_TRACEVFORK
    | PTRACE_O_TRACEVFORKDONE
    | PTRACE_O_TRACEEXEC
    | PTRACE_O_TRACEEXIT
)

_REQUEST_NAMES = {
    PTRACE_PEEKDATA: "PTRACE_PEEKDATA",
    PTRACE_POKEDATA: "PTRACE_POKEDATA",
    PTRACE_CONT: "PTRACE_CONT",
    PTRACE_SINGLESTEP: "PTRACE_SINGLESTEP",
    PTRACE_DETACH: "PTRACE_DETACH",
    PTRACE_SETOPTIONS: "PTRACE_SETOPTIONS",
    PTRACE_GETEVENTMSG: "PTRACE_GETEVENTMSG",
    PTRACE_GETSIGINFO: "PTRACE_GETSIGINFO",
    PTRACE_GETREGSET: "PTRACE_GETREGSET",
    PTRACE_SETREGSET: "PTRACE_SETREGSET",
    PTRACE_SEIZE: "PTRACE_SEIZE",
    PTRACE_INTERRUPT: "PTRACE_INTERRUPT",
    PTRACE_LISTEN: "PTRACE_LISTEN",
    PTRACE_GETSIGMASK: "PTRACE_GETSIGMASK",
    PTRACE_SETSIGMASK: "PTRACE_SETSIGMASK",
}

_libc = ctypes.CDLL(None, use_errno=True)

_ptrace = _libc.ptrace
_ptrace.restype = ctypes.c_long
_ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
# The same function without argument conversion, for the per-hit calls (half the ctypes cost).
# request and pid are ints in ptrace(2); addr and data go as prepared pointer-sized objects
# (or None), never as Python ints, which ctypes would pass as 32-bit ints.
_ptrace_raw = ctypes.CFUNCTYPE(ctypes.c_long, use_errno=True)(("ptrace", _libc))
_NT_PRSTATUS_ARG = ctypes.c_void_p(1)

_process_vm_readv = _libc.process_vm_readv
_process_vm_readv.restype = ctypes.c_ssize_t
_process_vm_writev = _libc.process_vm_writev
_process_vm_writev.restype = ctypes.c_ssize_t

_sched_getcpu = _libc.sched_getcpu
_sched_getcpu.restype = ctypes.c_int
_sched_getcpu.argtypes = []


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class SigInfo(ctypes.Structure):
    """The head of `siginfo_t` (128 bytes); `fields` is the union read by si_code."""

    _fields_ = [
        ("signo", ctypes.c_int),
        ("errno", ctypes.c_int),
        ("code", ctypes.c_int),
        ("_pad", ctypes.c_int),
        ("fields", ctypes.c_uint64 * 14),
    ]

    @property
    def pid(self) -> int:
        return int(self.fields[0] & 0xFFFFFFFF)

    @property
    def addr(self) -> int:
        return int(self.fields[0])


def error_text(err: int) -> str:
    return f"{errno.errorcode.get(err, str(err))} ({os.strerror(err)})"


def _fail(request: int, tid: int) -> PtraceError:
    err = ctypes.get_errno()
    name = _REQUEST_NAMES.get(request, hex(request))
    error = PtraceError(f"{name} on thread {tid} failed: {error_text(err)}")
    error.errno = err  # type: ignore[attr-defined]
    return error


def ptrace(request: int, tid: int, addr: int = 0, data: int = 0) -> int:
    """Raw ptrace(2); raises PtraceError (with `.errno`) when the kernel refuses."""
    result: int = _ptrace(request, tid, addr, data)
    if result == -1 and request != PTRACE_PEEKDATA:
        raise _fail(request, tid)
    return result


def ptrace_errno(error: BaseException) -> int | None:
    return getattr(error, "errno", None)


def seize(tid: int, options: int = SEIZE_OPTIONS) -> None:
    ptrace(PTRACE_SEIZE, tid, 0, options)


def interrupt(tid: int) -> None:
    ptrace(PTRACE_INTERRUPT, tid)


def cont(tid: int, signal: int = 0) -> None:
    ptrace(PTRACE_CONT, tid, 0, signal)


def listen(tid: int) -> None:
    ptrace(PTRACE_LISTEN, tid)


def singlestep(tid: int, signal: int = 0) -> None:
    ptrace(PTRACE_SINGLESTEP, tid, 0, signal)


def detach(tid: int, signal: int = 0) -> None:
    ptrace(PTRACE_DETACH, tid, 0, signal)


def get_event_message(tid: int) -> int:
    value = ctypes.c_ulong(0)
    ptrace(PTRACE_GETEVENTMSG, tid, 0, ctypes.addressof(value))
    return int(value.value)


def get_siginfo(tid: int, into: SigInfo | None = None) -> SigInfo:
    info = into if into is not None else SigInfo()
    ptrace(PTRACE_GETSIGINFO, tid, 0, ctypes.addressof(info))
    return info


def get_sigmask(tid: int) -> int:
    """The thread's blocked-signal mask (bit N-1 for signal N)."""
    mask = ctypes.c_uint64(0)
    ptrace(PTRACE_GETSIGMASK, tid, ctypes.sizeof(mask), ctypes.addressof(mask))
    return int(mask.value)


def set_sigmask(tid: int, value: int) -> None:
    """Set the thread's blocked-signal mask (the kernel never blocks SIGKILL, SIGSTOP)."""
    mask = ctypes.c_uint64(value & 0xFFFFFFFFFFFFFFFF)
    ptrace(PTRACE_SETSIGMASK, tid, ctypes.sizeof(mask), ctypes.addressof(mask))


def peek_word(tid: int, address: int) -> int:
    ctypes.set_errno(0)
    value: int = _ptrace(PTRACE_PEEKDATA, tid, address, 0)
    if value == -1 and ctypes.get_errno():
        raise _fail(PTRACE_PEEKDATA, tid)
    return value & 0xFFFFFFFFFFFFFFFF


def poke_word(tid: int, address: int, word: int) -> None:
    if word >= 1 << 63:
        word -= 1 << 64
    ptrace(PTRACE_POKEDATA, tid, address, word)


class RegisterSet:
    """One NT_PRSTATUS register buffer with its iovec prepared for GETREGSET/SETREGSET."""

    __slots__ = ("_iov_arg", "_size", "iov", "regs")

    def __init__(self, regs: ctypes.Structure) -> None:
        self.regs = regs
        self._size = ctypes.sizeof(regs)
        self.iov = IoVec(ctypes.addressof(regs), self._size)
        self._iov_arg = ctypes.c_void_p(ctypes.addressof(self.iov))

    def fetch(self, tid: int) -> None:
        self.iov.len = self._size
        if _ptrace_raw(PTRACE_GETREGSET, tid, _NT_PRSTATUS_ARG, self._iov_arg) == -1:
            raise _fail(PTRACE_GETREGSET, tid)

    def store(self, tid: int) -> None:
        self.iov.len = self._size
        if _ptrace_raw(PTRACE_SETREGSET, tid, _NT_PRSTATUS_ARG, self._iov_arg) == -1:
            raise _fail(PTRACE_SETREGSET, tid)


def cont_quietly(tid: int) -> int:
    """PTRACE_CONT without a signal, the per-hit resume; returns 0, or the errno."""
    if _ptrace_raw(PTRACE_CONT, tid, None, None) == -1:
        return ctypes.get_errno()
    return 0


class RemoteReader:
    """process_vm_readv into one reusable buffer: reads honour page protections like the
    kernel's copy_from_user (a PROT_NONE guard page faults), unlike /proc/PID/mem."""

    __slots__ = ("_buffer", "_local", "_local_ref", "_one", "_remote", "_remote_ref", "_zero")

    def __init__(self, capacity: int = 8192) -> None:
        self._buffer = ctypes.create_string_buffer(capacity)
        self._local = IoVec(ctypes.addressof(self._buffer), capacity)
        self._remote = IoVec(0, 0)
        self._local_ref = ctypes.byref(self._local)
        self._remote_ref = ctypes.byref(self._remote)
        self._one = ctypes.c_ulong(1)
        self._zero = ctypes.c_ulong(0)

    def read(self, pid: int, address: int, size: int) -> bytes:
        """Up to `size` bytes at `address`; fewer when the range runs into unreadable memory,
        empty when the first byte is unreadable."""
        if size > len(self._buffer):
            self._grow(size)
        if address < 0 or address + size > 1 << 64:
            return b""
        self._remote.base = address
        self._remote.len = size
        self._local.len = size
        got = _process_vm_readv(
            pid, self._local_ref, self._one, self._remote_ref, self._one, self._zero
        )
        if got <= 0:
            return b""
        return self._buffer.raw[:got]

    def _grow(self, size: int) -> None:
        self._buffer = ctypes.create_string_buffer(size)
        self._local.base = ctypes.addressof(self._buffer)


def remote_write(pid: int, address: int, data: bytes) -> int:
    """process_vm_writev: works on writable mappings only (no FOLL_FORCE); bytes written."""
    local_buffer = ctypes.create_string_buffer(data, len(data))
    local = IoVec(ctypes.addressof(local_buffer), len(data))
    remote = IoVec(address, len(data))
    got: int = _process_vm_writev(
        pid,
        ctypes.byref(local),
        ctypes.c_ulong(1),
        ctypes.byref(remote),
        ctypes.c_ulong(1),
        ctypes.c_ulong(0),
    )
    return got


def sched_getcpu() -> int:
    return int(_sched_getcpu())


# ---------------------------------------------------------------------------------------------
# wait status decoding (the kernel's layout, as <sys/wait.h> macros read it)


def stopped(status: int) -> bool:
    return (status & 0xFF) == 0x7F


def stop_signal(status: int) -> int:
    return (status >> 8) & 0xFF


def stop_event(status: int) -> int:
    return (status >> 16) & 0xFFFF


def exited(status: int) -> bool:
    return (status & 0x7F) == 0


def exit_code(status: int) -> int:
    return (status >> 8) & 0xFF


def term_signal(status: int) -> int:
    return status & 0x7F


def describe_status(status: int) -> str:
    """A human reading of a wait status, for messages and debugging."""
    if stopped(status):
        event = stop_event(status)
        return f"stopped sig={stop_signal(status)} event={event}"
    if exited(status):
        return f"exited {exit_code(status)}"
    return f"killed by signal {term_signal(status)}"
