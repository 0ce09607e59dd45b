"""Getting hold of processes: start a program under ptrace with the probes armed before its
first instruction, or seize every thread of a running process.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from probescope.engines.ptrace import spawn, syscalls
from probescope.engines.ptrace.tracee import Thread
from probescope.engines.ptrace.tracer_state import CHILD_EVENTS, ESRCH, STOP_SIGNALS, TracerState
from probescope.errors import PtraceError
from probescope.system import procfs


class Attaching(TracerState):
    """spawn() and attach(): a program's first stop, or all threads of a process stopped."""

    def spawn(self, argv: Sequence[str]) -> int:
        child = spawn.fork_held(argv)
        try:
            syscalls.seize(child.pid)
        except PtraceError:
            os.kill(child.pid, signal.SIGKILL)
            os.waitpid(child.pid, 0)
            child.close()
            raise
        self.root_pid = child.pid
        process = self._new_process(child.pid)
        thread = self._new_thread(child.pid, process)
        thread.running = True
        self._pin_tracer(child.pid)
        self._pin_thread(thread, None)
        child.release()
        while True:
            _, status = os.waitpid(child.pid, syscalls.WALL)
            if not syscalls.stopped(status):
                error = child.exec_error()
                self._forget_thread(thread)
                self._restore_tracer_affinity()
                raise PtraceError(
                    f"cannot start {argv[0]!r}: {error or syscalls.describe_status(status)}"
                )
            thread.running = False
            thread.stop_status = status
            if syscalls.stop_event(status) == syscalls.PTRACE_EVENT_EXEC:
                break
            sig = syscalls.stop_signal(status)
            self._resume(thread, 0 if sig == signal.SIGTRAP else sig)
        child.exec_error()
        thread.forget_comm()
        self.installer.prepare(thread, at_exec=True)
        self._resume(thread)
        return child.pid

    def attach(self, pid: int) -> None:
        if not procfs.process_exists(pid):
            raise PtraceError(f"no process with pid {pid}")
        tracer = procfs.tracer_of(pid)
        if tracer:
            raise PtraceError(
                f"process {pid} is already traced by process {tracer}",
                hint="a process can have one tracer: detach gdb/strace/ltrace first",
            )
        tgid = procfs.thread_group(pid) or pid
        if tgid != pid:
            raise PtraceError(f"{pid} is a thread of process {tgid}: attach to {tgid}")
        if self.root_pid is None:
            self.root_pid = pid
        process = self._new_process(pid)
        seized: list[Thread] = []
        while True:
            fresh = [tid for tid in procfs.thread_ids(pid) if tid not in self.threads]
            if not fresh:
                break
            for tid in fresh:
                try:
                    syscalls.seize(tid)
                except PtraceError as error:
                    if syscalls.ptrace_errno(error) == ESRCH:
                        continue
                    if procfs.tracer_of(tid) == os.getpid():
                        # Created by a thread we had just seized: attached for us already,
                        # it will report its first stop.
                        thread = self._new_thread(tid, process)
                        thread.running = True
                        seized.append(thread)
                        continue
                    raise self._attach_error(pid, error) from None
                thread = self._new_thread(tid, process)
                seized.append(thread)
                try:
                    syscalls.interrupt(tid)
                    thread.running = True
                except PtraceError:
                    pass
        if not seized:
            raise PtraceError(f"process {pid} has no thread left to attach to")
        for thread in seized:
            self._wait_stopped(thread)
        live = [t for t in seized if t.tid in self.threads]
        if not live:
            raise PtraceError(f"process {pid} exited while attaching")
        self._pin_tracer(pid)
        for thread in list(self.threads.values()):
            if thread.process is process:
                self._pin_thread(thread, None)
        self.installer.prepare(live[0], at_exec=False)
        for thread in live:
            self._resume(thread)

    def _attach_error(self, pid: int, error: PtraceError) -> PtraceError:
        err = syscalls.ptrace_errno(error)
        hint = None
        if err == 1:
            scope = procfs.ptrace_scope()
            if scope == 1:
                hint = (
                    "kernel.yama.ptrace_scope=1 allows tracing only descendants: start the "
                    "program under probescope (-c) or run with CAP_SYS_PTRACE"
                )
            elif scope and scope >= 2:
                hint = f"kernel.yama.ptrace_scope={scope} forbids attaching (needs root or none)"
            else:
                hint = "you may only trace your own processes (or need CAP_SYS_PTRACE)"
        return PtraceError(f"cannot attach to process {pid}: {error.message}", hint=hint)

    def _wait_stopped(self, thread: Thread) -> None:
        while thread.running and thread.tid in self.threads:
            _, status = os.waitpid(thread.tid, syscalls.WALL)
            if not syscalls.stopped(status):
                self._forget_thread(thread)
                return
            thread.running = False
            thread.stop_status = status
            event = syscalls.stop_event(status)
            sig = syscalls.stop_signal(status)
            if event == syscalls.PTRACE_EVENT_STOP:
                thread.group_stop = sig in STOP_SIGNALS
            elif event == 0:
                thread.pending_signal = sig
            else:
                # An event stop inside a system call (clone, exit...): not a place to inject
                # the XOL mmap from (the call's result is written after it). Note the event,
                # let the call finish and interrupt it again, at a safe place.
                if event in CHILD_EVENTS:
                    self._on_new_child(thread, event)
                try:
                    syscalls.cont(thread.tid)
                    thread.running = True
                    syscalls.interrupt(thread.tid)  # the event stop may have used up the first
                except PtraceError as error:
                    if syscalls.ptrace_errno(error) != ESRCH:
                        raise
