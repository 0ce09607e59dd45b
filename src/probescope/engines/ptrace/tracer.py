"""The tracer: attaches to threads, inserts breakpoints, turns ptrace stops into Events, and
detaches leaving every byte as it found it.

One ptrace stop per hit on the common path: at an int3 the registers are read once, fetchargs
evaluated, handlers run, then the probed instruction is either emulated on those registers or
run from its static XOL slot, and the thread is resumed. Return probes cost one more stop, at the
trampoline. All ptrace calls happen on the thread that attached (ptrace ties tracees to it).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator, Sequence

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import (
    rendezvous,
    restoring,
    returns,
    spawn,
    stepping,
    syscalls,
    xol,
)
from probescope.engines.ptrace.breakpoints import Installer
from probescope.engines.ptrace.fetch import FetchContext
from probescope.engines.ptrace.handlers import HitContext
from probescope.engines.ptrace.tracee import (
    AddressSpace,
    Breakpoint,
    Counters,
    ProbeSite,
    ReturnInstance,
    Thread,
    TracerOptions,
)
from probescope.engines.ptrace.waiting import InterruptibleWait
from probescope.errors import PtraceError
from probescope.events import Event, EventBatch
from probescope.symbols.unwinder import CATCH, UNWIND
from probescope.system import procfs

# What the kernel records in common_flags/common_preempt_count for a uprobe hit on Linux 6.18
# (read from trace_pipe_raw on the development machine: the trace line shows "DBZff").
UPROBE_FLAGS = 0xFF
UPROBE_PREEMPT_COUNT = 0xFF
TICK = 0.1
_STOP_SIGNALS = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
_FAULT_SIGNALS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGTRAP}
)
_ESRCH = 3
_CHILD_EVENTS = (
    syscalls.PTRACE_EVENT_FORK,
    syscalls.PTRACE_EVENT_VFORK,
    syscalls.PTRACE_EVENT_CLONE,
)


class Tracer:
    """All tracees of one engine session and the loop that serves their stops."""

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

    # =========================================================================================
    # Getting hold of processes

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
                    if syscalls.ptrace_errno(error) == _ESRCH:
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
                thread.group_stop = sig in _STOP_SIGNALS
            elif event == 0:
                thread.pending_signal = sig
            else:
                # An event stop inside a system call (clone, exit...): not a place to inject
                # the XOL mmap from (the call's result is written after it). Note the event,
                # let the call finish and interrupt it again, at a safe place.
                if event in _CHILD_EVENTS:
                    self._on_new_child(thread, event)
                try:
                    syscalls.cont(thread.tid)
                    thread.running = True
                    syscalls.interrupt(thread.tid)  # the event stop may have used up the first
                except PtraceError as error:
                    if syscalls.ptrace_errno(error) != _ESRCH:
                        raise

    # =========================================================================================
    # The loop

    def run(self) -> Iterator[Event | EventBatch]:
        """Serve stops until every tracee is gone or detach; yields events as they come and
        an empty EventBatch at each idle tick (every TICK seconds without events)."""
        waiter = InterruptibleWait(syscalls.WALL | syscalls.WNOTHREAD, TICK)
        self._waiter = waiter
        try:
            yield from self._serve(waiter)
        finally:
            waiter.close()

    def _serve(self, waiter: InterruptibleWait) -> Iterator[Event | EventBatch]:
        wait = waiter.wait
        threads = self.threads
        counters = self.counters
        while (threads or self.orphan_stops) and not self.detached:
            if self.detach_requested:
                self.detach()
                break
            try:
                got = wait()
            except ChildProcessError:
                break
            if self.detached:
                break
            if got is None:
                yield EventBatch([])
                continue
            pid, status = got
            counters.stops += 1
            thread = threads.get(pid)
            self.in_step = True
            try:
                if thread is None:
                    self._unknown(pid, status)
                else:
                    thread.running = False
                    thread.stop_status = status
                    if status & 0xFF == 0x7F:
                        if status >> 8 == signal.SIGTRAP:
                            self._on_trap(thread)
                        else:
                            self._on_stop(thread, status)
                    else:
                        self._on_exit(thread, status)
            except PtraceError:
                if not self.detached:
                    raise
                # detach() ran inside this stop (a handler or a signal handler called it): the
                # tracees are gone, what the stop recorded is still reported below.
            finally:
                self.in_step = False
            if self.out:
                out = self.out
                self.out = []
                yield from out
            if self.handler_error is not None:
                error, self.handler_error = self.handler_error, None
                raise error

    # -- traps -------------------------------------------------------------------------------

    def _on_trap(self, thread: Thread) -> None:
        tid = thread.tid
        regs = thread.regs
        thread.regset.fetch(tid)
        if thread.step is not None:
            self._finish_step(thread)
            return
        process = thread.process
        address = regs.rip - arch.TRAP_IP_ADVANCE
        bp = process.breakpoints.get(address)
        if bp is not None:
            if bp.ambiguous and not self._trapped_by_int3(tid):
                self._resume(thread, signal.SIGTRAP)
                return
            self._hit(thread, bp)
            return
        if address == process.trampoline:
            self._trampoline(thread)
            return
        info = syscalls.get_siginfo(tid, self._siginfo)
        if info.code == syscalls.SI_KERNEL:
            byte = process.memory.read(address, 1)
            if byte and byte != arch.BREAKPOINT:
                # Our int3 was removed (dlclose, detach race) after this thread trapped on it.
                regs.rip = address
                thread.regset.store(tid)
                self._resume(thread)
                return
        self._resume(thread, signal.SIGTRAP)

    def _trapped_by_int3(self, tid: int) -> bool:
        info = syscalls.get_siginfo(tid, self._siginfo)
        return bool(info.signo == signal.SIGTRAP and info.code == syscalls.SI_KERNEL)

    def _hit(self, thread: Thread, bp: Breakpoint) -> None:
        regs = thread.regs
        address = bp.address
        regs.rip = address  # what handlers and %ip see, as in the kernel's handle_swbp
        now = time.monotonic_ns()
        counters = self.counters
        if bp.internal is not None:
            counters.internal_hits += 1
            self._internal_hit(thread, bp)
        else:
            counters.hits += 1
        if thread.process.rendezvous is None:
            self.installer.maybe_rescan(thread)  # no dynamic-linker reports: look now and then
        if not thread.silent:
            if bp.entry_sites:
                self._emit_entries(thread, bp, now)
            if bp.return_sites and regs.rip == address and self._may_hijack(thread):
                done = returns.hijack(thread, bp, now)
                if done:
                    counters.hijacks += 1
                elif done is None:
                    counters.depth_omitted += 1
        if regs.rip == address:  # a handler may have sent the thread elsewhere: then skip it
            emulation = bp.instruction.emulation
            if (
                emulation is not None
                and self.options.emulate
                and emulation.apply(regs, thread.process.memory)
            ):
                counters.emulated += 1
            elif bp.single_step:
                stepping.prepare(thread, bp)
                thread.regset.store(thread.tid)
                thread.stop_status = 0
                counters.single_steps += 1
                syscalls.singlestep(thread.tid)
                thread.running = True
                return
            else:
                regs.rip = bp.slot
                counters.slot_runs += 1
        thread.regset.store(thread.tid)
        thread.stop_status = 0
        self._resume(thread)

    def _may_hijack(self, thread: Thread) -> bool:
        """Return probes are off in a process whose threads run with a user shadow stack
        (glibc turns it on after the exec stop, so each thread is checked at its first)."""
        process = thread.process
        if not thread.shstk_checked and process.return_refusal is None:
            thread.shstk_checked = True
            refusal = self.installer.return_refusal(thread)
            if refusal is not None:
                process.return_refusal = refusal
                self.counters.notes.append(refusal)
        return process.return_refusal is None

    def _internal_hit(self, thread: Thread, bp: Breakpoint) -> None:
        if bp.internal == "rendezvous":
            self.installer.rendezvous_hit(thread)
        elif bp.internal == UNWIND:
            returns.expose(thread)
        elif bp.internal == CATCH:
            returns.rehijack(thread)

    def _emit_entries(self, thread: Thread, bp: Breakpoint, now: int) -> None:
        ctx = self._fetch
        ctx.regs = thread.regs
        ctx.memory = thread.process.memory
        ctx.probe_base = bp.probe_base
        ctx.comm = thread.current_comm
        comm = thread.current_comm()
        cpu = self._event_cpu()
        by_event = self.counters.by_event
        for site in bp.entry_sites:
            args = site.fetcher.evaluate(ctx)
            by_event[site.key] = by_event.get(site.key, 0) + 1
            self.out.append(
                Event(now, cpu, thread.tgid, thread.tid, comm, site.event_type, bp.address,
                      None, args, UPROBE_FLAGS, UPROBE_PREEMPT_COUNT)
            )  # fmt: skip
            if site.handlers:
                self._call_handlers(site, HitContext(thread, site, bp, now, args))

    def _call_handlers(self, site: ProbeSite, ctx: HitContext) -> None:
        for handler in site.handlers:
            try:
                handler(ctx)
            except Exception as error:  # finish the hit, then report from the loop
                if self.handler_error is None:
                    self.handler_error = error

    def _event_cpu(self) -> int:
        return self.cpu if self.cpu is not None else syscalls.sched_getcpu()

    # -- return probes -----------------------------------------------------------------------

    def _trampoline(self, thread: Thread) -> None:
        self.counters.trampolines += 1
        if not thread.shadow:
            self.counters.notes.append(
                f"thread {thread.tid} returned through the trampoline with no return recorded"
            )
            self._resume(thread, signal.SIGSEGV)
            return
        now = time.monotonic_ns()
        original, instances = returns.returned(thread)
        thread.regs.rip = original  # %ip of a return probe is the caller's return address
        if not thread.silent:
            for instance in instances:
                self._emit_return(thread, instance, now)
        thread.regset.store(thread.tid)
        thread.stop_status = 0
        self._resume(thread)

    def _emit_return(self, thread: Thread, instance: ReturnInstance, now: int) -> None:
        bp = instance.breakpoint
        ctx = self._fetch
        ctx.regs = thread.regs
        ctx.memory = thread.process.memory
        ctx.probe_base = bp.probe_base
        ctx.comm = thread.current_comm
        comm = thread.current_comm()
        cpu = self._event_cpu()
        by_event = self.counters.by_event
        for site in bp.return_sites:
            args = site.fetcher.evaluate(ctx)
            by_event[site.key] = by_event.get(site.key, 0) + 1
            self.out.append(
                Event(now, cpu, thread.tgid, thread.tid, comm, site.event_type, bp.address,
                      instance.original, args, UPROBE_FLAGS, UPROBE_PREEMPT_COUNT)
            )  # fmt: skip
            if site.handlers:
                self._call_handlers(site, HitContext(thread, site, bp, now, args, instance))

    def _finish_step(self, thread: Thread) -> None:
        step = thread.step
        assert step is not None
        thread.step = None
        stepping.fix_up(thread, step)
        thread.regset.store(thread.tid)
        signal_to_deliver, thread.pending_signal = thread.pending_signal, 0
        self._resume(thread, signal_to_deliver)

    # -- other stops -------------------------------------------------------------------------

    def _on_stop(self, thread: Thread, status: int) -> None:
        event = syscalls.stop_event(status)
        sig = syscalls.stop_signal(status)
        if event == 0:
            self._on_signal(thread, sig)
        elif event == syscalls.PTRACE_EVENT_STOP:
            if thread.awaiting_first_stop:
                self._first_stop(thread)
            elif sig in _STOP_SIGNALS:
                thread.group_stop = True
                try:
                    syscalls.listen(thread.tid)
                    thread.running = True
                except PtraceError as error:
                    if syscalls.ptrace_errno(error) != _ESRCH:
                        raise
            else:
                thread.group_stop = False
                self._resume(thread)
        elif event in (
            syscalls.PTRACE_EVENT_FORK,
            syscalls.PTRACE_EVENT_VFORK,
            syscalls.PTRACE_EVENT_CLONE,
        ):
            self._on_new_child(thread, event)
            self._resume(thread)
        elif event == syscalls.PTRACE_EVENT_EXEC:
            self._on_exec(thread)
        elif event == syscalls.PTRACE_EVENT_EXIT:
            thread.shadow.clear()
            self._resume(thread)
        else:  # VFORK_DONE and anything newer
            self._resume(thread)

    def _on_signal(self, thread: Thread, sig: int) -> None:
        tid = thread.tid
        if thread.step is not None:
            thread.regset.fetch(tid)
            info = syscalls.get_siginfo(tid, self._siginfo)
            if sig in _FAULT_SIGNALS and info.code > 0 and thread.regs.rip == thread.step.slot:
                stepping.abort(thread)
                thread.regset.store(tid)
                self._resume(thread, sig)
            else:
                # Deliver it after the step, as the kernel does (uprobe_deny_signal).
                thread.pending_signal = sig
                syscalls.singlestep(tid)
                thread.running = True
            return
        if sig in _FAULT_SIGNALS:
            thread.regset.fetch(tid)
            rip = int(thread.regs.rip)
            if thread.process.in_xol(rip):
                info = syscalls.get_siginfo(tid, self._siginfo)
                owner = thread.process.slot_owner(rip)
                if info.code > 0 and owner is not None:
                    # The displaced copy faulted: report it at the original instruction.
                    thread.regs.rip = owner.address
                    thread.regset.store(tid)
        self._resume(thread, sig)

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
            if err and err != _ESRCH:
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
            if syscalls.ptrace_errno(error) != _ESRCH:
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

    # =========================================================================================
    # Detach: stop everyone, put every byte back, let go

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
                thread.group_stop = sig in _STOP_SIGNALS
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


def exit_status_code(status: int | None) -> int | None:
    """A shell-style exit code for a wait status: the code, or -signal."""
    if status is None:
        return None
    if syscalls.exited(status):
        return syscalls.exit_code(status)
    return -syscalls.term_signal(status)
