"""Letting go: stop every tracee, put every byte back (text, hijacked return addresses, USDT
semaphores, XOL pages, CPU affinity) and detach — whatever stop each thread was in.
"""

from __future__ import annotations

import os
import signal

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import restoring, returns, stepping, syscalls
from probescope.engines.ptrace.tracee import Thread
from probescope.engines.ptrace.tracer_state import STOP_SIGNALS, TracerState
from probescope.errors import PtraceError


class Detaching(TracerState):
    """detach(): leave every tracee as it was found."""

    def detach(self) -> None:
        if self.detached:
            return
        self.detaching = True
        try:
            self._stop_all()
            for thread in list(self.threads.values()):
                restoring.settle(thread)
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
                    restoring.release_xol(process, sharing, safe, self.injector)
            for thread in list(self.threads.values()):
                self._restore_affinity(thread)
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

    def _stop_all(self) -> None:
        for thread in list(self.threads.values()):
            if thread.running:
                try:
                    syscalls.interrupt(thread.tid)
                except PtraceError:
                    pass
        while any(t.running for t in self.threads.values()):
            try:
                pid, status = os.waitpid(-1, syscalls.WALL | syscalls.WNOTHREAD)
            except ChildProcessError:
                break
            stopped_thread = self.threads.get(pid)
            if stopped_thread is None:
                if syscalls.stopped(status):
                    self.orphan_stops[pid] = status
                continue
            thread = stopped_thread
            thread.running = False
            thread.stop_status = status
            if not syscalls.stopped(status):
                self._on_exit(thread, status)
                continue
            event = syscalls.stop_event(status)
            sig = syscalls.stop_signal(status)
            if event == 0:
                if thread.step is not None and sig == signal.SIGTRAP:
                    thread.regset.fetch(thread.tid)
                    step = thread.step
                    thread.step = None
                    stepping.fix_up(thread, step)
                    thread.regset.store(thread.tid)
                elif sig == signal.SIGTRAP:
                    self._settle_trap(thread)
                    thread.stop_status = 0
                else:
                    thread.pending_signal = sig
            elif event == syscalls.PTRACE_EVENT_STOP:
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

    def _settle_trap(self, thread: Thread) -> None:
        """A SIGTRAP stop seen while detaching: undo our int3 or trampoline, else pass it on."""
        thread.regset.fetch(thread.tid)
        regs = thread.regs
        process = thread.process
        address = int(regs.rip) - arch.TRAP_IP_ADVANCE
        bp = process.breakpoints.get(address)
        if bp is not None and (not bp.ambiguous or self._trapped_by_int3(thread.tid)):
            regs.rip = address
            thread.regset.store(thread.tid)
            return
        if address == process.trampoline and thread.shadow:
            regs.rip = returns.returned(thread)[0]
            thread.regset.store(thread.tid)
            return
        thread.pending_signal = signal.SIGTRAP
