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
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import procfs, rendezvous, spawn, syscalls, unwinder, xol
from probescope.engines.ptrace.fetch import FetchContext
from probescope.engines.ptrace.handlers import HitContext
from probescope.engines.ptrace.tracee import (
    AddressSpace,
    Breakpoint,
    ProbeSite,
    ReturnInstance,
    StepInFlight,
    Thread,
)
from probescope.engines.ptrace.waiting import InterruptibleWait
from probescope.errors import PtraceError
from probescope.events import Event, EventBatch

MAX_URETPROBE_DEPTH = 64
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
_SCAN_INTERVAL = 1.0
_MAX_STACK_SCAN = 8 << 20


@dataclass
class TracerOptions:
    follow_children: bool = True
    pin_cpu: bool | int = True
    emulate: bool = True  # False: run every instruction from its slot (testing, comparison)
    single_step: bool = False  # True: the kernel's way, single-step every displaced insn


@dataclass
class Counters:
    stops: int = 0
    hits: int = 0
    internal_hits: int = 0  # the dynamic linker's rendezvous and unwinder hooks
    emulated: int = 0
    slot_runs: int = 0
    single_steps: int = 0
    hijacks: int = 0
    trampolines: int = 0
    depth_omitted: int = 0
    breakpoints: int = 0
    xol_pages: int = 0
    by_event: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Tracer:
    """All tracees of one engine session and the loop that serves their stops."""

    def __init__(self, sites: Sequence[ProbeSite], options: TracerOptions) -> None:
        self.sites = list(sites)
        self.options = options
        self.sites_by_file: dict[tuple[int, int, int], list[ProbeSite]] = {}
        for site in self.sites:
            self.sites_by_file.setdefault(site.file_key, []).append(site)
        self.has_return_sites = any(s.is_return for s in self.sites)
        self.threads: dict[int, Thread] = {}
        self.processes: dict[int, AddressSpace] = {}
        self.orphan_stops: dict[int, int] = {}
        self.unfollowed: set[int] = set()  # fork children to restore and let go
        self.injector = xol.SyscallInjector()
        self.counters = Counters()
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
            if syscalls.stop_event(status) == syscalls.PTRACE_EVENT_EXEC:
                break
            sig = syscalls.stop_signal(status)
            self._resume(thread, 0 if sig == signal.SIGTRAP else sig)
        child.exec_error()
        thread.forget_comm()
        self._prepare_process(thread, at_exec=True)
        self._resume(thread)
        return child.pid

    def attach(self, pid: int) -> None:
        if not os.path.exists(f"/proc/{pid}"):
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
        for thread in live:
            self._pin_thread(thread, None)
        self._prepare_process(live[0], at_exec=False)
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
            event = syscalls.stop_event(status)
            sig = syscalls.stop_signal(status)
            if event == syscalls.PTRACE_EVENT_STOP:
                thread.group_stop = sig in _STOP_SIGNALS
            elif event == 0:
                thread.pending_signal = sig

    # =========================================================================================
    # Breakpoints in one address space

    def _prepare_process(self, thread: Thread, *, at_exec: bool) -> None:
        process = thread.process
        mappings = process.mappings()
        process.last_scan = time.monotonic()
        if self.has_return_sites:
            process.return_refusal = self._return_refusal(thread)
        self._apply(thread, mappings, strict=True)
        self._install_rendezvous(thread, mappings)

    def _return_refusal(self, thread: Thread) -> str | None:
        if procfs.shadow_stack_enabled(thread.tid):
            return (
                f"return probes disabled in process {thread.tgid}: x86 user shadow stack "
                "(CET shstk) is enabled and a hijacked return address would fault"
            )
        return None

    def _apply(
        self, thread: Thread, mappings: list[procfs.Mapping], *, strict: bool = False
    ) -> None:
        """Insert every probe whose file is mapped and not yet probed; forget breakpoints whose
        mapping went away (dlclose)."""
        process = thread.process
        wanted: list[tuple[procfs.Mapping, int, list[ProbeSite]]] = []
        live: set[int] = set()
        for mapping in mappings:
            if not mapping.executable or not mapping.inode:
                continue
            sites = self.sites_by_file.get(mapping.file_key)
            if not sites:
                continue
            by_offset: dict[int, list[ProbeSite]] = {}
            for site in sites:
                if mapping.contains_offset(site.offset):
                    by_offset.setdefault(site.offset, []).append(site)
            for offset, group in by_offset.items():
                address = mapping.address_of(offset)
                live.add(address)
                existing = process.breakpoints.get(address)
                if existing is not None and existing.file_offset == offset:
                    continue
                wanted.append((mapping, offset, group))
        for address, bp in list(process.breakpoints.items()):
            if bp.internal is None and address not in live:
                del process.breakpoints[address]
        if self.has_return_sites:
            self._hook_unwinders(thread, mappings)
        if not wanted:
            return
        if self.has_return_sites and process.trampoline is None:
            self._make_trampoline(thread, wanted[0][0])
        by_mapping: dict[int, list[tuple[procfs.Mapping, int, list[ProbeSite]]]] = {}
        for item in wanted:
            by_mapping.setdefault(item[0].start, []).append(item)
        for items in by_mapping.values():
            for mapping, offset, group in items:
                try:
                    self._insert(
                        thread, mapping, mapping.address_of(offset), offset, group, len(items)
                    )
                except PtraceError as error:
                    if strict:
                        raise
                    self.counters.notes.append(error.message)

    def _insert(
        self,
        thread: Thread,
        mapping: procfs.Mapping,
        address: int,
        offset: int,
        sites: list[ProbeSite] | None,
        batch: int = 1,
        internal: str | None = None,
    ) -> Breakpoint:
        process = thread.process
        code = process.memory.read(address, arch.MAX_INSTRUCTION + 1)
        if not code:
            raise PtraceError(f"cannot read the instruction at 0x{address:x} in {thread.tgid}")
        instruction = arch.analyze(code, address)
        bp = Breakpoint(
            address=address,
            file_offset=offset,
            instruction=instruction,
            internal=internal,
            mapping_start=mapping.start,
            mapping_key=mapping.file_key,
        )
        for site in sites or []:
            (bp.return_sites if site.is_return else bp.entry_sites).append(site)
        slot = self._slot(thread, address, batch)
        code_in_slot = None if self.options.single_step else instruction.slot_code(slot)
        if code_in_slot is None:
            bp.single_step = True
            bp.step_plan = instruction.step_plan()
            bp.step_slot = slot
            code_in_slot = bp.step_plan.code
        else:
            bp.slot = slot
        process.memory.write_code(slot, code_in_slot, thread.tid)
        process.breakpoints[address] = bp
        process.memory.write_code(address, arch.BREAKPOINT, thread.tid)
        bp.inserted = True
        self.counters.breakpoints += 1
        return bp

    def _hook_unwinders(self, thread: Thread, mappings: list[procfs.Mapping]) -> None:
        """Breakpoints where exception unwinding starts and where it is caught (unwinder.py)."""
        process = thread.process
        main = unwinder.executable_path(thread.tgid)
        try:
            main_key = procfs.file_key(f"/proc/{thread.tgid}/exe") if main else None
        except OSError:
            main_key = None
        for mapping in mappings:
            key = mapping.file_key
            if not mapping.executable or not mapping.inode or key in process.unwinder_checked:
                continue
            if not unwinder.worth_checking(mapping.path, key == main_key):
                continue
            process.unwinder_checked.add(key)
            paths = [
                mapping.path,
                f"/proc/{thread.tgid}/root{mapping.path}",
                f"/proc/{thread.tgid}/map_files/{mapping.start:x}-{mapping.end:x}",
            ]
            for kind, offset in unwinder.hooks_in(paths, key):
                holder = next(
                    (
                        m
                        for m in mappings
                        if m.file_key == key and m.executable and m.contains_offset(offset)
                    ),
                    None,
                )
                if holder is None:
                    continue
                address = holder.address_of(offset)
                existing = process.breakpoints.get(address)
                if existing is not None:
                    existing.internal = kind
                    continue
                try:
                    self._insert(thread, holder, address, offset, None, internal=kind)
                except PtraceError as error:
                    self.counters.notes.append(
                        f"C++ exceptions through return probes unsupported: {error.message}"
                    )

    def _slot(self, thread: Thread, near: int, batch: int = 1) -> int:
        process = thread.process
        slot = xol.take_slot(process, near)
        if slot is not None:
            return slot
        size = max(
            arch.PAGE_SIZE,
            (batch + 2) * arch.SLOT_SIZE + arch.PAGE_SIZE - 1 & ~(arch.PAGE_SIZE - 1),
        )
        start, in_reach = xol.allocate_area(self.injector, thread, near, near + 1, size)
        self.counters.xol_pages += size // arch.PAGE_SIZE
        xol.add_area(process, start, size)
        slot = xol.take_slot(process, near if in_reach else None)
        if slot is None:
            raise PtraceError(f"no XOL slot available in process {thread.tgid}")
        return slot

    def _make_trampoline(self, thread: Thread, mapping: procfs.Mapping) -> None:
        process = thread.process
        slot = xol.take_slot(process, None)
        if slot is None:
            slot = self._slot(thread, mapping.start, 8)
        process.memory.write_code(slot, arch.BREAKPOINT * arch.SLOT_SIZE, thread.tid)
        process.trampoline = slot

    def _install_rendezvous(self, thread: Thread, mappings: list[procfs.Mapping]) -> None:
        process = thread.process
        try:
            auxv = procfs.read_auxv(thread.tgid)
        except OSError:
            return
        found = rendezvous.from_dt_debug(thread.tgid, process.memory, auxv)
        if found is None:
            found = rendezvous.from_interpreter(thread.tgid, auxv, mappings)
        if found is None:
            return
        mapping = next((m for m in mappings if m.start <= found.r_brk < m.end), None)
        if mapping is None:
            return
        if found.r_brk not in process.breakpoints:
            try:
                self._insert(
                    thread,
                    mapping,
                    found.r_brk,
                    found.r_brk - mapping.start + mapping.offset,
                    None,
                    internal="rendezvous",
                )
            except PtraceError as error:
                self.counters.notes.append(f"dlopen tracking off: {error.message}")
                return
        else:
            process.breakpoints[found.r_brk].internal = "rendezvous"
        found.changed(process.memory)
        process.rendezvous = found

    def _rescan(self, thread: Thread) -> None:
        process = thread.process
        process.last_scan = time.monotonic()
        try:
            mappings = process.mappings()
        except OSError:
            return
        self._apply(thread, mappings)
        if process.rendezvous is None:
            self._install_rendezvous(thread, mappings)

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
                if self.detached:
                    break
                raise
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
        regs.rip = address
        now = time.monotonic_ns()
        counters = self.counters
        if bp.internal is not None:
            counters.internal_hits += 1
            self._internal_hit(thread, bp)
        else:
            counters.hits += 1
        if not thread.silent:
            if bp.entry_sites:
                self._emit_entries(thread, bp, now)
            if bp.return_sites and regs.rip == address and thread.process.return_refusal is None:
                self._hijack(thread, bp, now)
        if regs.rip == address:
            emulation = bp.instruction.emulation
            if bp.single_step:
                if (
                    emulation is not None
                    and self.options.emulate
                    and emulation.apply(regs, thread.process.memory)
                ):
                    counters.emulated += 1
                else:
                    self._start_step(thread, bp)
                    return
            elif (
                emulation is not None
                and self.options.emulate
                and emulation.apply(regs, thread.process.memory)
            ):
                counters.emulated += 1
            else:
                regs.rip = bp.slot
                counters.slot_runs += 1
        thread.regset.store(thread.tid)
        thread.stop_status = 0
        self._resume(thread)

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
                Event(
                    now,
                    cpu,
                    thread.tgid,
                    thread.tid,
                    comm,
                    site.event_type,
                    bp.address,
                    None,
                    args,
                    UPROBE_FLAGS,
                    UPROBE_PREEMPT_COUNT,
                )
            )
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

    def _hijack(self, thread: Thread, bp: Breakpoint, now: int) -> None:
        process = thread.process
        trampoline = process.trampoline
        if trampoline is None:
            return
        sp = int(thread.regs.rsp)
        original = process.memory.read_word(sp)
        if original is None:
            return
        chained = original == trampoline
        shadow = thread.shadow
        if chained:
            while shadow and not sp <= shadow[-1].stack:
                shadow.pop()
        else:
            while shadow and not sp < shadow[-1].stack:
                shadow.pop()
        if len(shadow) >= MAX_URETPROBE_DEPTH:
            self.counters.depth_omitted += 1
            return
        if chained:
            if not shadow:
                return
            original = shadow[-1].original
        shadow.append(ReturnInstance(sp, original, bp, chained, now))
        if not chained and not process.memory.write_data(sp, struct.pack("<Q", trampoline)):
            shadow.pop()
            return
        self.counters.hijacks += 1

    def _trampoline(self, thread: Thread) -> None:
        regs = thread.regs
        shadow = thread.shadow
        self.counters.trampolines += 1
        if not shadow:
            self.counters.notes.append(
                f"thread {thread.tid} returned through the trampoline with no return recorded"
            )
            self._resume(thread, signal.SIGSEGV)
            return
        sp = int(regs.rsp)
        now = time.monotonic_ns()
        while shadow:
            chain_start = len(shadow) - 1
            while chain_start > 0 and shadow[chain_start].chained:
                chain_start -= 1
            next_index = chain_start - 1
            valid = next_index < 0 or sp <= shadow[next_index].stack
            chain = shadow[chain_start:][::-1]
            del shadow[chain_start:]
            regs.rip = chain[0].original
            if valid:
                for instance in chain:
                    if not thread.silent:
                        self._emit_return(thread, instance, now)
                break
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
                Event(
                    now,
                    cpu,
                    thread.tgid,
                    thread.tid,
                    comm,
                    site.event_type,
                    bp.address,
                    instance.original,
                    args,
                    UPROBE_FLAGS,
                    UPROBE_PREEMPT_COUNT,
                )
            )
            if site.handlers:
                self._call_handlers(site, HitContext(thread, site, bp, now, args, instance))

    # -- the single-step fallback ------------------------------------------------------------

    def _start_step(self, thread: Thread, bp: Breakpoint) -> None:
        plan = bp.step_plan
        assert plan is not None and bp.step_slot is not None
        regs = thread.regs
        saved = None
        if plan.scratch is not None:
            saved = int(getattr(regs, plan.scratch))
            setattr(regs, plan.scratch, bp.instruction.next_ip)
        regs.rip = bp.step_slot
        thread.step = StepInFlight(bp, bp.step_slot, saved)
        thread.regset.store(thread.tid)
        thread.stop_status = 0
        self.counters.single_steps += 1
        syscalls.singlestep(thread.tid)
        thread.running = True

    def _finish_step(self, thread: Thread) -> None:
        step = thread.step
        assert step is not None
        thread.step = None
        self._step_fixups(thread, step)
        thread.regset.store(thread.tid)
        signal_to_deliver, thread.pending_signal = thread.pending_signal, 0
        self._resume(thread, signal_to_deliver)

    def _step_fixups(self, thread: Thread, step: StepInFlight) -> None:
        regs = thread.regs
        bp = step.breakpoint
        plan = bp.step_plan
        assert plan is not None
        correction = bp.address - step.slot
        if plan.scratch is not None and step.saved_scratch is not None:
            setattr(regs, plan.scratch, step.saved_scratch)
        if plan.fixups & arch.FIX_IP:
            regs.rip = (int(regs.rip) + correction) & arch.U64
        if plan.fixups & arch.FIX_CALL:
            sp = int(regs.rsp)
            pushed = thread.process.memory.read_word(sp)
            if pushed is not None:
                thread.process.memory.write_data(
                    sp, struct.pack("<Q", (pushed + correction) & arch.U64)
                )

    def _abort_step(self, thread: Thread) -> None:
        """The stepped copy did not run (a fault in it, or detach): back to the probe site."""
        step = thread.step
        assert step is not None
        thread.step = None
        plan = step.breakpoint.step_plan
        if plan is not None and plan.scratch is not None and step.saved_scratch is not None:
            setattr(thread.regs, plan.scratch, step.saved_scratch)
        thread.regs.rip = step.breakpoint.address

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
            self._maybe_rescan(thread)
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
                self._abort_step(thread)
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

    def _maybe_rescan(self, thread: Thread) -> None:
        process = thread.process
        if process.rendezvous is None and time.monotonic() - process.last_scan > _SCAN_INTERVAL:
            self._rescan(thread)

    def _internal_hit(self, thread: Thread, bp: Breakpoint) -> None:
        if bp.internal == "rendezvous":
            self._rendezvous_hit(thread)
        elif bp.internal == unwinder.EXPOSE:
            self._expose_returns(thread)
        elif bp.internal == unwinder.CATCH:
            self._rehijack_returns(thread)

    def _expose_returns(self, thread: Thread) -> None:
        """An exception starts unwinding: let the unwinder see real return addresses."""
        process = thread.process
        for instance in thread.shadow:
            if instance.exposed:
                continue
            instance.exposed = True
            if (
                not instance.chained
                and process.memory.read_word(instance.stack) == process.trampoline
            ):
                process.memory.write_data(instance.stack, struct.pack("<Q", instance.original))

    def _rehijack_returns(self, thread: Thread) -> None:
        """An exception was caught: frames below sp are gone, the others get their hijack back."""
        process = thread.process
        sp = int(thread.regs.rsp)
        shadow = thread.shadow
        while shadow and not sp < shadow[-1].stack:
            shadow.pop()
        trampoline = process.trampoline
        for instance in shadow:
            if not instance.exposed or trampoline is None:
                continue
            instance.exposed = False
            if (
                not instance.chained
                and process.memory.read_word(instance.stack) == instance.original
            ):
                process.memory.write_data(instance.stack, struct.pack("<Q", trampoline))

    def _rendezvous_hit(self, thread: Thread) -> None:
        process = thread.process
        found = process.rendezvous
        if found is None:
            return
        state = found.state(process.memory)
        if state not in (None, rendezvous.RT_CONSISTENT):
            return
        if state is None or found.changed(process.memory):
            self._rescan(thread)

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
        self._restore_returns(thread)
        for bp in process.breakpoints.values():
            try:
                process.memory.write_code(bp.address, bp.instruction.raw[:1], thread.tid)
            except PtraceError:
                pass
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
        self._prepare_process(thread, at_exec=True)
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
                self._settle(thread)
            done: set[int] = set()
            for thread in list(self.threads.values()):
                process = thread.process
                if id(process) in done or process.closed:
                    continue
                done.add(id(process))
                self._restore_process(process, thread)
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
                    self._step_fixups(thread, step)
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
            self._unwind_trampoline(thread)
            thread.regset.store(thread.tid)
            return
        thread.pending_signal = signal.SIGTRAP

    def _unwind_trampoline(self, thread: Thread) -> None:
        sp = int(thread.regs.rsp)
        shadow = thread.shadow
        while shadow:
            chain_start = len(shadow) - 1
            while chain_start > 0 and shadow[chain_start].chained:
                chain_start -= 1
            next_index = chain_start - 1
            valid = next_index < 0 or sp <= shadow[next_index].stack
            thread.regs.rip = shadow[chain_start].original
            del shadow[chain_start:]
            if valid:
                break

    def _settle(self, thread: Thread) -> None:
        """Make a stopped thread's registers independent of our breakpoints and XOL pages."""
        tid = thread.tid
        try:
            if thread.injection_regs is not None:
                thread.regs.assign(thread.injection_regs)
                thread.injection_regs = None
                thread.regset.store(tid)
            thread.regset.fetch(tid)
        except PtraceError:
            return
        regs = thread.regs
        process = thread.process
        changed = False
        if thread.step is not None:
            self._abort_step(thread)
            changed = True
        address = int(regs.rip) - arch.TRAP_IP_ADVANCE
        bp = process.breakpoints.get(address)
        unserved = syscalls.stopped(thread.stop_status) and (
            thread.stop_status >> 8 == signal.SIGTRAP
        )
        if bp is not None and unserved:
            # Stopped on our int3 but not yet served (detach from a signal handler).
            regs.rip = address
            changed = True
        elif unserved and address == process.trampoline and thread.shadow:
            self._unwind_trampoline(thread)
            changed = True
        rip = int(regs.rip)
        if process.in_xol(rip):
            resolved = self._out_of_slot(process, rip)
            if resolved is not None:
                regs.rip = resolved
                changed = True
        if changed:
            thread.regset.store(tid)

    def _out_of_slot(self, process: AddressSpace, rip: int) -> int | None:
        """Where a thread whose ip is inside a slot would go, following our own jumps."""
        owner = process.slot_owner(rip)
        if owner is not None:
            return owner.address  # at the copy: run the original instead
        for _ in range(4):
            code = process.memory.read(rip, 16)
            if code[:2] == b"\xff\x25" and code[2:6] == b"\0\0\0\0":
                return int(struct.unpack_from("<Q", code, 6)[0])
            if code[:1] == b"\xe9":
                rip = rip + 5 + struct.unpack_from("<i", code, 1)[0]
            elif code[:2] == b"\xeb\x08":
                rip = rip + 10
            else:
                return None
            if not process.in_xol(rip):
                return rip
        return None

    def _restore_returns(self, thread: Thread) -> None:
        process = thread.process
        trampoline = process.trampoline
        for instance in thread.shadow:
            if instance.chained or instance.exposed:
                continue
            if process.memory.read_word(instance.stack) == trampoline:
                process.memory.write_data(instance.stack, struct.pack("<Q", instance.original))
        thread.shadow.clear()

    def _restore_process(self, process: AddressSpace, stopped: Thread) -> None:
        threads = [t for t in self.threads.values() if t.process is process]
        for thread in threads:
            self._restore_returns(thread)
        try:
            mappings = process.mappings()
        except OSError:
            mappings = []
        for bp in process.breakpoints.values():
            if not _still_mapped(bp, mappings):
                continue
            current = process.memory.read(bp.address, 1)
            if current == arch.BREAKPOINT:
                try:
                    process.memory.write_code(bp.address, bp.instruction.raw[:1], stopped.tid)
                except PtraceError as error:
                    self.counters.notes.append(error.message)
        self._release_xol(process, threads, stopped)

    def _release_xol(self, process: AddressSpace, threads: list[Thread], stopped: Thread) -> None:
        """munmap our pages unless something still points into them (a stacked return
        address, a signal frame): then they stay, harmless."""
        if not process.xol_areas:
            return
        for thread in threads:
            if process.in_xol(int(thread.regs.rip)):
                return
            if self._stack_refers_to_xol(process, thread):
                return
        if stopped.process is not process:
            return
        for start, size in process.xol_areas:
            try:
                self.injector.run(stopped, arch.SYS_MUNMAP, start, size)
            except PtraceError:
                return
        process.xol_areas.clear()

    def _stack_refers_to_xol(self, process: AddressSpace, thread: Thread) -> bool:
        # Live return addresses and signal frames are at or above sp; the red zone below it
        # only holds dead copies (a returned-from trampoline slot, for instance).
        sp = int(thread.regs.rsp)
        try:
            mapping = next((m for m in process.mappings() if m.start <= sp < m.end), None)
        except OSError:
            return True
        if mapping is None:
            return True
        end = min(mapping.end, sp + _MAX_STACK_SCAN)
        cursor = max(sp & ~7, mapping.start)
        while cursor < end:
            data = process.memory.read(cursor, min(65536, end - cursor))
            if not data:
                return True
            for (word,) in struct.iter_unpack("<Q", data[: len(data) & ~7]):
                if process.in_xol(word):
                    return True
            cursor += len(data)
        return False


def _still_mapped(bp: Breakpoint, mappings: list[procfs.Mapping]) -> bool:
    """Whether bp's address still shows the same file offset of the same file."""
    for m in mappings:
        if m.start <= bp.address < m.end:
            return m.file_key == bp.mapping_key and m.address_of(bp.file_offset) == bp.address
    return False


def exit_status_code(status: int | None) -> int | None:
    """A shell-style exit code for a wait status: the code, or -signal."""
    if status is None:
        return None
    if syscalls.exited(status):
        return syscalls.exit_code(status)
    return -syscalls.term_signal(status)
