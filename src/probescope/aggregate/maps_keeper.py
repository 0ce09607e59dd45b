"""The memory maps of a command's processes as they were when each exec'd and exited.

Stacks are symbolized after the fact: the tracefs engine's events reach user space some
milliseconds after the hit, and a short command has exited by then — with its memory, so
`/proc/PID/maps` is empty and no address can be placed in a file. A helper process therefore
`PTRACE_SEIZE`s the command before it execs, with only exec, fork/clone and exit stops (no
breakpoints, no signal changes): at each exec and at each process's exit — before the kernel
releases its memory, dlopen'd libraries included — it copies `/proc/PID/maps` down a pipe and
lets the process go on. The helper dies with probescope (PR_SET_PDEATHSIG); the kernel then
detaches it and the command runs on untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from probescope.aggregate.symbolize import ProcessMaps

MAPS_POLL_SECONDS = 0.01
"""How often the watcher reads the maps of the processes it watches."""

PTRACE_CONT = 7
PTRACE_GETEVENTMSG = 0x4201
PTRACE_SEIZE = 0x4206
PTRACE_LISTEN = 0x4208
OPTIONS = 0x2 | 0x4 | 0x8 | 0x10 | 0x40  # TRACEFORK, VFORK, CLONE, EXEC, EXIT
EVENT_FORK, EVENT_VFORK, EVENT_CLONE, EVENT_EXEC, EVENT_EXIT, EVENT_STOP = 1, 2, 3, 4, 6, 128
WALL = 0x40000000
PR_SET_PDEATHSIG = 1
_HEADER = struct.Struct("<iI")
_GROUP_STOPS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


class MapsKeeper:
    """Runs the helper for one process tree; `on_maps(pid, text)` gets each copy (from a
    reader thread)."""

    def __init__(self, on_maps: Callable[[int, str], None]) -> None:
        self.on_maps = on_maps
        self.helper: int | None = None
        self._reader: threading.Thread | None = None
        self._pipe = -1

    def start(self, pid: int) -> bool:
        """Seize `pid` (a child not yet exec'd); False when ptrace is refused."""
        read_end, write_end = os.pipe()
        helper = os.fork()
        if helper == 0:  # the helper
            status = 1
            try:
                # Keep no descriptor of the parent's but the pipe: one end of the command's
                # gate held here would keep an aborted command waiting on it forever.
                os.closerange(3, write_end)
                os.closerange(write_end + 1, os.sysconf("SC_OPEN_MAX"))
                status = _serve(pid, write_end)
            finally:
                os._exit(status)
        os.close(write_end)
        ready = os.read(read_end, 1)
        if ready != b"r":
            os.close(read_end)
            os.waitpid(helper, 0)
            return False
        self.helper = helper
        self._pipe = read_end
        self._reader = threading.Thread(target=self._read, name="probescope-maps", daemon=True)
        self._reader.start()
        return True

    def _read(self) -> None:
        stream = os.fdopen(self._pipe, "rb", buffering=1 << 16)
        with stream:
            while True:
                header = stream.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    return
                pid, length = _HEADER.unpack(header)
                text = stream.read(length)
                if len(text) < length:
                    return
                self.on_maps(pid, text.decode("utf-8", "surrogateescape"))

    def stop(self) -> None:
        """End the helper (the kernel detaches whatever it still traces) and its reader."""
        if self.helper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.helper, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.helper, 0)
            self.helper = None
        if self._reader is not None:
            self._reader.join(timeout=2.0)
            self._reader = None


def _serve(pid: int, out: int) -> int:
    """The helper's life: seize, then copy maps at exec and exit stops until nothing is left."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    if libc.ptrace(PTRACE_SEIZE, pid, None, OPTIONS) != 0:
        return 1
    os.write(out, b"r")
    traced = {pid}
    message = ctypes.c_ulong()
    while traced:
        try:
            stopped, status = os.waitpid(-1, WALL)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            traced.discard(stopped)
            continue
        if not os.WIFSTOPPED(status):
            continue
        signum = os.WSTOPSIG(status)
        event = status >> 16
        deliver = 0
        if event in (EVENT_EXEC, EVENT_EXIT):
            if _is_leader(stopped):
                _send_maps(stopped, out)
        elif event in (EVENT_FORK, EVENT_VFORK, EVENT_CLONE):
            if libc.ptrace(PTRACE_GETEVENTMSG, stopped, None, ctypes.byref(message)) == 0:
                traced.add(int(message.value))
        elif event == EVENT_STOP:
            if signum in _GROUP_STOPS:
                libc.ptrace(PTRACE_LISTEN, stopped, None, None)
                continue
        else:
            deliver = signum  # an ordinary signal: pass it on unchanged
        traced.add(stopped)
        libc.ptrace(PTRACE_CONT, stopped, None, deliver)
    return 0


def _is_leader(tid: int) -> bool:
    """A thread group's leader (its maps are the process's; other threads' exits are not)."""
    try:
        with open(f"/proc/{tid}/status") as status:
            for line in status:
                if line.startswith("Tgid:"):
                    return int(line.split()[1]) == tid
    except (OSError, ValueError):
        return False
    return False


def _send_maps(pid: int, out: int) -> None:
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            text = maps.read()
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.write(out, _HEADER.pack(pid, len(text)) + text)


class MapsWatcher:
    """Reads the target processes' maps every few milliseconds while they live, so addresses
    of a process that exits before its events are aggregated still find their files."""

    def __init__(self, maps: ProcessMaps, pids: tuple[int, ...]) -> None:
        self.maps = maps
        self.pids = pids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="probescope-maps", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            alive = False
            for pid in self.pids:
                for tid in _process_and_children(pid):
                    alive = self.maps.read(tid) or alive
            if not alive and all(self.maps.known(pid) for pid in self.pids):
                return
            self._stop.wait(MAPS_POLL_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


def _process_and_children(pid: int) -> list[int]:
    found = [pid]
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found += [int(child) for child in children.read().split()]
    return found
