"""Stopping every thread of a process for a moment, and letting all of them go again.

The fentry engine is not a resident tracer: it attaches only for a transaction (inject the
areas, patch or restore sites, serve a handshake) and detaches, so between transactions the
program runs with no tracer at all. A transaction seizes every thread (PTRACE_SEIZE, then
PTRACE_INTERRUPT), waits until each one is in a stop where nothing of the program runs, does its
work and detaches them all. Threads created meanwhile are caught through PTRACE_O_TRACECLONE.
An injected system call leaves its thread in a single-step trap; `settle()` turns that into an
interrupt stop, so that a tracer killed at that moment leaves no SIGTRAP to be delivered.
"""

from __future__ import annotations

import os
import signal
import time

from probescope.engines.ptrace import syscalls
from probescope.engines.ptrace.tracee import AddressSpace, Thread
from probescope.errors import PtraceError
from probescope.system import procfs

_ESRCH = 3
_STOP_SIGNALS = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
SEIZE_OPTIONS = syscalls.PTRACE_O_TRACECLONE
EXEC_OPTIONS = syscalls.PTRACE_O_TRACECLONE | syscalls.PTRACE_O_TRACEEXEC | 0x1  # TRACESYSGOOD
_WAIT_LIMIT = 10.0


class ProcessGone(PtraceError):
    """The process exited (or exec'd away) before or during the transaction."""


class StoppedProcess:
    """Every thread of process `pid` held in a ptrace stop until `release()`."""

    def __init__(self, pid: int, options: int = SEIZE_OPTIONS) -> None:
        self.pid = pid
        self.options = options
        self.space = AddressSpace(pid)
        self.threads: dict[int, Thread] = {}
        self.exited: set[int] = set()
        self.released = False

    # -- stopping ---------------------------------------------------------------------------

    def stop(self, seized: dict[int, int] | None = None) -> StoppedProcess:
        """Seize and stop every thread (`seized`: tid → wait status of threads the caller
        attached and holds in a stop already, e.g. a command at its exec)."""
        for tid, status in (seized or {}).items():
            thread = Thread(tid, self.space, self.pid)
            thread.stop_status = status
            self.threads[tid] = thread
        try:
            self._seize_all()
            deadline = time.monotonic() + _WAIT_LIMIT
            while any(t.running for t in self.threads.values()):
                if time.monotonic() > deadline:
                    raise PtraceError(f"threads of process {self.pid} would not stop")
                self._wait_one()
                self._seize_all()
        except BaseException:
            self.release()
            raise
        if not self.threads:
            self.release()
            raise ProcessGone(f"process {self.pid} exited")
        return self

    def _seize_all(self) -> None:
        while True:
            fresh = [
                t
                for t in procfs.thread_ids(self.pid)
                if t not in self.threads and t not in self.exited
            ]
            if not fresh:
                return
            for tid in fresh:
                try:
                    syscalls.seize(tid, self.options)
                except PtraceError as error:
                    if syscalls.ptrace_errno(error) == _ESRCH:
                        self.exited.add(tid)
                        continue
                    if procfs.tracer_of(tid) == os.getpid():
                        thread = Thread(tid, self.space, self.pid)  # auto-attached clone
                        thread.running = True
                        self.threads[tid] = thread
                        continue
                    raise
                thread = Thread(tid, self.space, self.pid)
                self.threads[tid] = thread
                try:
                    syscalls.interrupt(tid)
                except PtraceError:
                    pass
                thread.running = True

    def _wait_one(self) -> None:
        """Collect one stop of a thread we wait for (polled per thread: a wait for any child
        could reap a child process of the caller's that is none of ours)."""
        got = None
        for tid in [t.tid for t in self.threads.values() if t.running]:
            try:
                pid, status = os.waitpid(tid, os.WNOHANG | syscalls.WALL)
            except ChildProcessError:
                self.threads.pop(tid, None)
                self.exited.add(tid)
                continue
            if pid:
                got = (tid, status)
                break
        if got is None:
            time.sleep(0.0002)
            return
        tid, status = got
        thread = self.threads[tid]
        if not syscalls.stopped(status):
            self.threads.pop(tid, None)
            self.exited.add(tid)
            return
        thread.running = False
        thread.stop_status = status
        event = syscalls.stop_event(status)
        sig = syscalls.stop_signal(status)
        if event == syscalls.PTRACE_EVENT_STOP:
            thread.group_stop = sig in _STOP_SIGNALS
        elif event == 0:
            thread.pending_signal = sig  # fine to work in; the signal goes on at release
        else:
            # an event stop inside a system call (clone): let the call finish, stop again
            try:
                syscalls.cont(tid)
                syscalls.interrupt(tid)
                thread.running = True
            except PtraceError as error:
                if syscalls.ptrace_errno(error) != _ESRCH:
                    raise

    # -- working ----------------------------------------------------------------------------

    def injectable(self) -> Thread:
        """A thread whose stop lets it run an injected system call (not an event stop inside
        a system call, whose result the kernel writes after the stop)."""
        for thread in self.threads.values():
            status = thread.stop_status
            if syscalls.stop_event(status) in (
                0,
                syscalls.PTRACE_EVENT_STOP,
                syscalls.PTRACE_EVENT_EXEC,
            ):
                return thread
        raise PtraceError(f"no thread of process {self.pid} can run an injected system call")

    def settle(self, thread: Thread) -> None:
        """After injected system calls: move the thread from its single-step trap into an
        interrupt stop (a tracer dying now would otherwise leave SIGTRAP to kill it)."""
        try:
            syscalls.interrupt(thread.tid)
            syscalls.cont(thread.tid, 0)
        except PtraceError:
            return
        while True:
            try:
                _, status = os.waitpid(thread.tid, syscalls.WALL)
            except ChildProcessError:
                return
            if not syscalls.stopped(status):
                self.threads.pop(thread.tid, None)
                return
            thread.stop_status = status
            event = syscalls.stop_event(status)
            sig = syscalls.stop_signal(status)
            if event == syscalls.PTRACE_EVENT_STOP:
                return
            if event == 0:
                thread.pending_signal = sig  # a signal arrived first: deliver it at release
            try:
                syscalls.cont(thread.tid, 0)
            except PtraceError:
                return

    def registers(self, thread: Thread) -> None:
        thread.regset.fetch(thread.tid)

    # -- releasing --------------------------------------------------------------------------

    def release(self) -> None:
        """Detach every thread, handing back the signal each was stopped with."""
        if self.released:
            return
        self.released = True
        for thread in self.threads.values():
            try:
                syscalls.detach(thread.tid, thread.pending_signal)
            except PtraceError:
                pass
        self.space.memory.close()

    def __enter__(self) -> StoppedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
