"""The tracer: the loop that turns ptrace stops into Events.

One ptrace stop per hit on the common path: at an int3 the registers are read once, fetchargs
evaluated, handlers run, then the probed instruction is either emulated on those registers or
run from its static XOL slot, and the thread is resumed. Return probes cost one more stop, at the
trampoline. All ptrace calls happen on the thread that attached (ptrace ties tracees to it).

Tracer combines that loop with getting hold of processes (attaching.py), letting them go leaving
every byte as it was found (detaching.py) and the bookkeeping of its tracees (tracer_state.py).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import returns, stepping, syscalls
from probescope.engines.ptrace.attaching import Attaching
from probescope.engines.ptrace.detaching import Detaching
from probescope.engines.ptrace.handlers import HitContext
from probescope.engines.ptrace.tracee import Breakpoint, ProbeSite, ReturnInstance, Thread
from probescope.engines.ptrace.tracer_state import ESRCH, STOP_SIGNALS
from probescope.engines.ptrace.waiting import InterruptibleWait
from probescope.errors import PtraceError
from probescope.events import Event, EventBatch
from probescope.symbols.unwinder import CATCH, UNWIND

# What the kernel records in common_flags/common_preempt_count for a uprobe hit on Linux 6.18
# (read from trace_pipe_raw on the development machine: the trace line shows "DBZff").
UPROBE_FLAGS = 0xFF
UPROBE_PREEMPT_COUNT = 0xFF
TICK = 0.1
_FAULT_SIGNALS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGTRAP}
)


class Tracer(Attaching, Detaching):
    """All tracees of one engine session and the loop that serves their stops."""

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
            elif sig in STOP_SIGNALS:
                thread.group_stop = True
                try:
                    syscalls.listen(thread.tid)
                    thread.running = True
                except PtraceError as error:
                    if syscalls.ptrace_errno(error) != ESRCH:
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


def exit_status_code(status: int | None) -> int | None:
    """A shell-style exit code for a wait status: the code, or -signal."""
    if status is None:
        return None
    if syscalls.exited(status):
        return syscalls.exit_code(status)
    return -syscalls.term_signal(status)
