"""What a tracer holds: its threads and address spaces, how they come and go (clone, fork,
vfork, exec, exit), how a stopped one is resumed, and the CPU they are pinned to.

Tracer (tracer.py) serves their stops; Attaching and Detaching (attaching.py, detaching.py) get
hold of processes and let them go. All three share this state.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import rendezvous, restoring, returns, syscalls, xol
from probescope.engines.ptrace.breakpoints import Installer
from probescope.engines.ptrace.fetch import FetchContext
from probescope.engines.ptrace.tracee import (
    AddressSpace,
    Counters,
    ProbeSite,
    Thread,
    TracerOptions,
)
from probescope.engines.ptrace.waiting import InterruptibleWait
from probescope.errors import PtraceError
from probescope.events import Event
from probescope.system import procfs

STOP_SIGNALS = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
ESRCH = 3
CHILD_EVENTS = (
    syscalls.PTRACE_EVENT_FORK,
    syscalls.PTRACE_EVENT_VFORK,
    syscalls.PTRACE_EVENT_CLONE,
)


class TracerState:
    """All threads and address spaces of one engine session, and the bookkeeping around them."""

    def __init__(self, sites: Sequence[ProbeSite], options: TracerOptions) -> None:
        self.sites = list(sites)
        self.options = options
        self.threads: dict[int, Thread] = {}
        self.processes: dict[int, AddressSpace] = {}
        self.orphan_stops: dict[int, int] = {}
        self.unfollowed: set[int] = set()  # fork children to restore and let go
        self.injector = xol.SyscallInjector()
        self.counters = Counters()
        self.installer = Installer(self.sites, options, self.counters, self.injector)
        self.out: list[Event] = []
        self.root_pid: int | None = None
        self.root_status: int | None = None
        self.cpu: int | None = None
        self.tracer_affinity: set[int] | None = None
        self.detached = False
        self.detaching = False
        self.detach_requested = False
        self.handler_error: BaseException | None = None
        self.in_step = False
        self._siginfo = syscalls.SigInfo()
        self._waiter: InterruptibleWait | None = None
        self._fetch = FetchContext(arch.Registers(), None)  # type: ignore[arg-type]

    def _trapped_by_int3(self, tid: int) -> bool:
        info = syscalls.get_siginfo(tid, self._siginfo)
        return bool(info.signo == signal.SIGTRAP and info.code == syscalls.SI_KERNEL)

    # -- threads and processes coming and going ----------------------------------------------

    def _on_new_child(self, parent: Thread, event: int) -> None:
        child = syscalls.get_event_message(parent.tid)
        if child in self.threads:
            return
        is_thread = False
        if event == syscalls.PTRACE_EVENT_CLONE:
            is_thread = procfs.thread_group(child) == parent.tgid
        if is_thread:
            thread = self._new_thread(child, parent.process, parent.tgid)
        elif event == syscalls.PTRACE_EVENT_VFORK:
            thread = self._new_thread(child, parent.process, child)
            thread.shadow = list(parent.shadow)
            thread.silent = not self.options.follow_children
        else:
            process = self._copy_process(parent.process, child)
            thread = self._new_thread(child, process, child)
            thread.shadow = list(parent.shadow)
            if not self.options.follow_children:
                self.unfollowed.add(child)
        thread.saved_affinity = parent.saved_affinity
        thread.comm = parent.comm
        thread.awaiting_first_stop = True
        thread.running = True
        early = self.orphan_stops.pop(child, None)
        if early is not None:
            thread.running = False
            self._first_stop(thread)

    def _copy_process(self, parent: AddressSpace, child: int) -> AddressSpace:
        process = self._new_process(child)
        process.breakpoints = dict(parent.breakpoints)
        process.xol_areas = list(parent.xol_areas)
        process.xol_used = dict(parent.xol_used)
        process.trampoline = parent.trampoline
        process.semaphores = dict(parent.semaphores)
        process.return_refusal = parent.return_refusal
        if parent.rendezvous is not None:
            process.rendezvous = rendezvous.Rendezvous(
                parent.rendezvous.r_brk, parent.rendezvous.r_debug, parent.rendezvous.objects
            )
        return process

    def _first_stop(self, thread: Thread) -> None:
        thread.awaiting_first_stop = False
        if self.detaching:
            return
        if thread.tid in self.unfollowed:
            self.unfollowed.discard(thread.tid)
            self._release_copy(thread)
            return
        self._resume(thread)

    def _release_copy(self, thread: Thread) -> None:
        """A fork child we do not follow: put its copy of the text and stack back, let go."""
        process = thread.process
        returns.restore(thread)
        restoring.restore_text(process, thread, self.counters.notes)
        restoring.restore_semaphores(process)
        self._restore_affinity(thread)
        try:
            syscalls.detach(thread.tid, thread.pending_signal)
        except PtraceError:
            pass
        self._forget_thread(thread)

    def _on_exec(self, thread: Thread) -> None:
        former = syscalls.get_event_message(thread.tid)
        tgid = thread.tgid
        old = thread.process
        if former != thread.tid and former in self.threads:
            mover = self.threads.pop(former)
            old_leader = self.threads.get(thread.tid)
            if old_leader is not None and old_leader is not mover:
                self._forget_thread(old_leader)
            mover.tid = thread.tid
            mover.stop_status = thread.stop_status
            self.threads[thread.tid] = mover
            thread = mover
        for other in [t for t in self.threads.values() if t.tgid == tgid and t is not thread]:
            self._forget_thread(other)
        thread.shadow.clear()
        thread.step = None
        thread.forget_comm()
        shared = old.tgid != tgid
        if not shared:
            old.memory.close()
            old.closed = True
            self.injector.forget(old)
            self.processes.pop(old.tgid, None)
        else:
            old.threads.discard(thread.tid)
        process = self._new_process(tgid)
        process.threads.add(thread.tid)
        thread.process = process
        if thread.silent:
            self._restore_affinity(thread)
            try:
                syscalls.detach(thread.tid)
            except PtraceError:
                pass
            self._forget_thread(thread)
            return
        self.installer.prepare(thread, at_exec=True)
        self._resume(thread)

    def _on_exit(self, thread: Thread, status: int) -> None:
        tgid = thread.tgid
        self._forget_thread(thread)
        if tgid == thread.tid and tgid == self.root_pid:
            self.root_status = status
        if not any(t.tgid == tgid for t in self.threads.values()):
            process = self.processes.get(tgid)
            if process is not None and not any(t.process is process for t in self.threads.values()):
                process.memory.close()
                process.closed = True
                self.injector.forget(process)
                del self.processes[tgid]

    def _unknown(self, pid: int, status: int) -> None:
        if syscalls.stopped(status):
            self.orphan_stops[pid] = status

    # -- small helpers -----------------------------------------------------------------------

    def _new_process(self, tgid: int) -> AddressSpace:
        process = AddressSpace(tgid)
        self.processes[tgid] = process
        return process

    def _new_thread(self, tid: int, process: AddressSpace, tgid: int | None = None) -> Thread:
        thread = Thread(tid, process, tgid)
        self.threads[tid] = thread
        process.threads.add(tid)
        return thread

    def _forget_thread(self, thread: Thread) -> None:
        if self.threads.get(thread.tid) is thread:
            del self.threads[thread.tid]
        thread.process.threads.discard(thread.tid)

    def _resume(self, thread: Thread, sig: int = 0) -> None:
        if self.detached or self.detaching:
            if sig:
                thread.pending_signal = sig
            return
        if thread.pending_signal and not sig:
            sig, thread.pending_signal = thread.pending_signal, 0
        if not sig and not thread.group_stop:
            err = syscalls.cont_quietly(thread.tid)
            if err and err != ESRCH:
                raise PtraceError(
                    f"PTRACE_CONT on thread {thread.tid} failed: {syscalls.error_text(err)}"
                )
            thread.running = True  # (ESRCH: killed meanwhile, its exit report will follow)
            return
        try:
            if thread.group_stop:
                syscalls.listen(thread.tid)
            else:
                syscalls.cont(thread.tid, sig)
            thread.running = True
        except PtraceError as error:
            if syscalls.ptrace_errno(error) != ESRCH:
                raise
            thread.running = True  # killed meanwhile: its exit report will follow

    # -- CPU affinity ------------------------------------------------------------------------

    def _pin_tracer(self, pid: int) -> None:
        if self.options.pin_cpu is False or self.cpu is not None:
            return
        try:
            mine = os.sched_getaffinity(0)
            theirs = os.sched_getaffinity(pid)
        except OSError:
            return
        if isinstance(self.options.pin_cpu, int) and not isinstance(self.options.pin_cpu, bool):
            cpu = self.options.pin_cpu
        else:
            common = mine & theirs
            current = syscalls.sched_getcpu()
            cpu = current if current in common else min(common or mine)
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            return
        self.tracer_affinity = mine
        self.cpu = cpu

    def _pin_thread(self, thread: Thread, original: set[int] | None) -> None:
        if self.cpu is None:
            return
        try:
            thread.saved_affinity = original or os.sched_getaffinity(thread.tid)
            os.sched_setaffinity(thread.tid, {self.cpu})
        except OSError:
            thread.saved_affinity = None

    def _restore_affinity(self, thread: Thread) -> None:
        if thread.saved_affinity is None:
            return
        try:
            os.sched_setaffinity(thread.tid, thread.saved_affinity)
        except OSError:
            pass

    def _restore_tracer_affinity(self) -> None:
        if self.tracer_affinity is not None:
            try:
                os.sched_setaffinity(0, self.tracer_affinity)
            except OSError:
                pass
            self.tracer_affinity = None
