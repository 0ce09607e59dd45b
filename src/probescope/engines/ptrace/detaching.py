"""Letting go: stop every tracee, put every byte back (text, hijacked return addresses, USDT
semaphores, XOL pages, the dead man's switch, CPU affinity) and detach — whatever stop each
thread was in.

Detach may run at any point of the loop (a handler or a signal handler calls it, an exception
cuts a stop's handling short), so it asks the kernel rather than its bookkeeping: which
threads are stopped (a ptrace request on a running thread fails), what stop each is in (its
siginfo), where it is (its registers). Threads of a traced process it never heard of (a clone
whose report was lost) are found in /proc and let go as well. Waiting for stops is bounded: a
thread that never reports is detached by the kernel when probescope exits.
"""

from __future__ import annotations

import errno
import os
import time

from probescope.engines.ptrace import restoring, returns, syscalls
from probescope.engines.ptrace.tracee import Thread
from probescope.engines.ptrace.tracer_state import STOP_SIGNALS, TracerState
from probescope.errors import PtraceError
from probescope.system import procfs

_STOP_TIMEOUT = 5.0


class Detaching(TracerState):
    """detach(): leave every tracee as it was found."""

    def detach(self) -> None:
        if self.detached:
            return
        self.detaching = True
        try:
            self._adopt_unknown_threads()
            self._stop_all()
            info = syscalls.SigInfo()
            for thread in list(self.threads.values()):
                restoring.settle(thread, self._stop_info(thread, info))
            done: set[int] = set()
            for thread in list(self.threads.values()):
                process = thread.process
                if id(process) in done or process.closed:
                    continue
                done.add(id(process))
                sharing = [t for t in self.threads.values() if t.process is process]
                for other in sharing:
                    returns.restore(other)
                restoring.restore_text(process, thread, self.counters.notes)
                restoring.restore_semaphores(process)
                safe = next((t for t in sharing if restoring.can_inject(t)), None)
                if safe is not None:
                    restoring.release_areas(process, sharing, safe, self.injector)
            for thread in list(self.threads.values()):
                self._restore_affinity(thread)
                restoring.reblock(thread)
                try:
                    syscalls.detach(thread.tid, thread.pending_signal)
                except PtraceError:
                    pass
        finally:
            self.detached = True
            if self._waiter is not None:
                self._waiter.close()  # no more timer ticks once we are done
            for process in self.processes.values():
                process.memory.close()
                process.closed = True
            self._restore_tracer_affinity()

    def _stop_info(self, thread: Thread, into: syscalls.SigInfo) -> syscalls.SigInfo | None:
        """The siginfo of the stop the thread is in, None when it has none (or is gone)."""
        try:
            return syscalls.get_siginfo(thread.tid, into)
        except PtraceError:
            return None

    def _adopt_unknown_threads(self) -> None:
        """Threads we trace but never heard of (their clone report was lost): track them."""
        me = os.getpid()
        for process in list(self.processes.values()):
            if process.closed:
                continue
            for tid in procfs.thread_ids(process.tgid):
                if tid in self.threads or procfs.tracer_of(tid) != me:
                    continue
                thread = self._new_thread(tid, process, process.tgid)
                thread.running = True

    def _stop_all(self) -> None:
        probe = syscalls.SigInfo()
        for thread in list(self.threads.values()):
            if self._stopped_now(thread, probe):
                thread.running = False
                continue
            thread.running = True
            try:
                syscalls.interrupt(thread.tid)
            except PtraceError:
                pass
        deadline = time.monotonic() + _STOP_TIMEOUT
        pause = 0.0005
        while any(t.running for t in self.threads.values()):
            try:
                pid, status = os.waitpid(-1, syscalls.WALL | syscalls.WNOTHREAD | os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                if time.monotonic() > deadline:
                    break  # never reported: the kernel detaches it when we exit
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
                continue
            stopped_thread = self.threads.get(pid)
            if stopped_thread is None:
                if syscalls.stopped(status):
                    self.orphan_stops[pid] = status
                continue
            thread = stopped_thread
            thread.running = False
            thread.serving = False
            thread.stop_status = status
            if not syscalls.stopped(status):
                self._on_exit(thread, status)
                continue
            event = syscalls.stop_event(status)
            sig = syscalls.stop_signal(status)
            if event == syscalls.PTRACE_EVENT_STOP:
                thread.group_stop = sig in STOP_SIGNALS
                thread.awaiting_first_stop = False
            elif event in (
                syscalls.PTRACE_EVENT_FORK,
                syscalls.PTRACE_EVENT_VFORK,
                syscalls.PTRACE_EVENT_CLONE,
            ):
                self._on_new_child(thread, event)
                child = self.threads.get(syscalls.get_event_message(thread.tid))
                if child is not None and not child.awaiting_first_stop:
                    child.running = False
            elif event == syscalls.PTRACE_EVENT_EXEC:
                self._exec_while_detaching(thread)
        for pid, _status in list(self.orphan_stops.items()):
            # Stopped new tracees whose parent event we never saw: let them go untouched.
            try:
                syscalls.detach(pid)
            except PtraceError:
                pass
        self.orphan_stops.clear()

    def _stopped_now(self, thread: Thread, probe: syscalls.SigInfo) -> bool:
        """Whether the kernel has the thread in a ptrace-stop now (requests other than
        PTRACE_INTERRUPT fail with ESRCH on a running tracee)."""
        try:
            syscalls.get_siginfo(thread.tid, probe)
        except PtraceError as error:
            # EINVAL: a group-stop of a PTRACE_ATTACHed tracee (stopped, but no siginfo)
            return syscalls.ptrace_errno(error) == errno.EINVAL
        return True

    def _exec_while_detaching(self, thread: Thread) -> None:
        tgid = thread.tgid
        for other in [t for t in self.threads.values() if t.tgid == tgid and t is not thread]:
            self._forget_thread(other)
        former = syscalls.get_event_message(thread.tid)
        if former != thread.tid:
            self.threads.pop(former, None)
            thread.tid = tgid
            self.threads[tgid] = thread
        old = thread.process
        if old.tgid == tgid:
            old.memory.close()
            old.closed = True
        process = self._new_process(tgid)
        thread.process = process
        thread.shadow.clear()
        thread.step = None
