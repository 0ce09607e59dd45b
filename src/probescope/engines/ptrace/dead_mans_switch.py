"""The dead man's switch: what lets a traced process outlive a probescope killed without
detaching (SIGKILL, the OOM killer).

A tracer that dies leaves its tracees running on with the registers they have: a thread stopped
at a hit resumes just after the trap byte, hijacked return addresses still point at the
trampoline, every probe site still traps. So each traced address space gets an area (mapped
r-x by an injected mmap, like the XOL pages) holding the handler assembled from
dead_mans_switch.S, a table of the probe sites (address, XOL slot, original bytes), a table of
the hijacked return addresses (stack slot, real address) and the registers of a thread lent
to an injected system call. The handler is installed for SIGTRAP, and for SIGSEGV when free,
only where the program left those signals at their default action; while probescope traces it
never runs (every such signal stops the thread for the tracer first).

A tracer that dies takes nothing along: the kernel drops the signal a stopped tracee was
about to be given and lets every tracee run on from the registers it has. So the sites are
laid out so that whatever stop a thread is in at that moment, it runs correctly or traps again
into the handler. Where SIGSEGV is free every site gets `hlt`, which is privileged: in user
mode it faults *before* it runs (#GP, SIGSEGV), so a thread stopped on it resumes on it and
faults again, and the tracer sees the hit with ip on the site. Elsewhere the instruction is
covered by int3s: a thread resumed one byte in traps at once — unless another thread's
handler has put the text back first (the window that remains for programs that handle SIGSEGV
themselves). The trampoline is a slot of int3s. The handler then puts every original byte
back, sends the thread to the probed instruction or its real return address, and from then on
the program runs untraced at full speed. Nothing here costs a hit anything: the tables change
when probes are inserted or removed and when a return address is hijacked at a new stack slot.
"""

from __future__ import annotations

import os
import signal
import struct
from collections.abc import Callable, Iterable

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import syscalls
from probescope.engines.ptrace.dead_mans_switch_code import CONSTANTS, IMAGE, LABELS
from probescope.engines.ptrace.memory import TraceeMemory
from probescope.engines.ptrace.tracee import Thread
from probescope.engines.ptrace.xol import SyscallInjector
from probescope.errors import PtraceError
from probescope.system import procfs
from probescope.system.maps import Mapping

AREA_SIZE = CONSTANTS["AREA_SIZE"]
SITE_CAPACITY = CONSTANTS["SITE_CAPACITY"]
RETURN_CAPACITY = CONSTANTS["RETURN_CAPACITY"]
MASK_BYTES = CONSTANTS["MASK_BYTES"]
MAGIC = IMAGE[:32]
SIGNALS = (signal.SIGTRAP, signal.SIGSEGV)
SYS_RT_SIGACTION = 13
_SITES = CONSTANTS["SITES_OFFSET"]
_SITE_SIZE = CONSTANTS["SITE_SIZE"]
_RETURNS = CONSTANTS["RETURNS_OFFSET"]
_RETURN_SIZE = CONSTANTS["RETURN_SIZE"]
_SIGACTION_SIZE = 32
_RED_ZONE = 128
# The kernel's restart codes, and what resuming a thread stopped inside a system call does
# with them when its tracer lets it go without a signal (arch_do_signal_or_restart).
_RESTART_SAME = (-512, -513, -514)  # ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND
_RESTART_BLOCK = -516  # ERESTART_RESTARTBLOCK
_SYS_RESTART_SYSCALL = 219
_GREGS_ORDER = (
    "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15",
    "rdi", "rsi", "rbp", "rbx", "rdx", "rax", "rcx", "rsp", "rip", "eflags",
)  # fmt: skip


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _mask_bytes(cpus: Iterable[int]) -> bytes:
    mask = bytearray(MASK_BYTES)
    for cpu in cpus:
        if 0 <= cpu < MASK_BYTES * 8:
            mask[cpu // 8] |= 1 << (cpu % 8)
    return bytes(mask)


class DeadMansSwitch:
    """One address space's switch: where its area is, which signals it handles, and the
    tracer's copy of its tables (where each site and hijacked slot is recorded)."""

    def __init__(self, base: int, signals: frozenset[int]) -> None:
        self.base = base
        self.signals = signals
        self.sites: dict[int, int] = {}  # site address -> entry index
        self.returns: dict[int, tuple[int, int]] = {}  # stack slot -> (entry index, original)

    @property
    def armed(self) -> bool:
        """Whether the handler is installed (for SIGTRAP: the trampoline's, int3s')."""
        return signal.SIGTRAP in self.signals

    @property
    def faults_handled(self) -> bool:
        """Whether sites may carry `hlt` (its SIGSEGV reaches the handler)."""
        return signal.SIGSEGV in self.signals

    def copy(self) -> DeadMansSwitch:
        """The switch of a fork child: a copy of the area at the same address."""
        clone = DeadMansSwitch(self.base, self.signals)
        clone.sites = dict(self.sites)
        clone.returns = dict(self.returns)
        return clone

    def contains(self, address: int) -> bool:
        return self.base <= address < self.base + AREA_SIZE

    # -- the tables --------------------------------------------------------------------------

    def add_site(
        self, memory: TraceeMemory, tid: int, address: int, slot: int | None, original: bytes
    ) -> None:
        """Record a site before its trap bytes are written."""
        index = self.sites.get(address)
        if index is None:
            index = len(self.sites)
            if index >= SITE_CAPACITY:
                raise PtraceError(
                    f"more than {SITE_CAPACITY} probe sites in process {memory.pid}",
                    hint="probe fewer functions (the engine's safety table is full)",
                )
        entry = struct.pack("<QQ", address, slot or 0) + original.ljust(15, b"\0")[:15]
        entry += bytes([len(original)])
        memory.write_code(self.base + _SITES + index * _SITE_SIZE, entry, tid)
        if address not in self.sites:
            self.sites[address] = index
            self._write_u64(memory, tid, LABELS["site_count"], len(self.sites))

    def remove_site(self, memory: TraceeMemory, tid: int, address: int) -> None:
        """Forget a site whose mapping went away (the last entry moves into its place)."""
        index = self.sites.pop(address, None)
        if index is None:
            return
        last = len(self.sites)
        if index != last:
            moved = next(a for a, i in self.sites.items() if i == last)
            entry = memory.read(self.base + _SITES + last * _SITE_SIZE, _SITE_SIZE)
            memory.write_code(self.base + _SITES + index * _SITE_SIZE, entry, tid)
            self.sites[moved] = index
        self._write_u64(memory, tid, LABELS["site_count"], len(self.sites))

    def clear_sites(self, memory: TraceeMemory, tid: int) -> None:
        """No site of ours is left (every byte was put back): the handler must not touch text."""
        self.sites.clear()
        self._write_u64(memory, tid, LABELS["site_count"], 0)

    def set_trampoline(self, memory: TraceeMemory, tid: int, address: int) -> None:
        self._write_u64(memory, tid, LABELS["trampoline"], address)

    def record_return(
        self,
        memory: TraceeMemory,
        tid: int,
        stack: int,
        original: int,
        live: Callable[[], set[int]],
    ) -> bool:
        """Record that the return address at `stack` is about to be hijacked (before it is);
        False when the table holds only live hijacks (the caller then leaves it alone).
        `live()` gives the stack slots of every pending return in the address space."""
        known = self.returns.get(stack)
        if known is not None and known[1] == original:
            return True  # the same call site at the same depth: the entry is already right
        if known is not None:
            index = known[0]
        elif len(self.returns) < RETURN_CAPACITY:
            index = len(self.returns)
        else:
            alive = live()
            stale = next((s for s in self.returns if s not in alive), None)
            if stale is None:
                return False
            index = self.returns.pop(stale)[0]
        memory.write_code(
            self.base + _RETURNS + index * _RETURN_SIZE, struct.pack("<QQ", stack, original), tid
        )
        self.returns[stack] = (index, original)
        return True

    def lend(self, memory: TraceeMemory, tid: int, resume_ip: int, regs: arch.Registers) -> None:
        """A thread is about to run an injected system call: the registers it must resume
        with if it is caught by the step trap at `resume_ip` with nobody tracing it."""
        values = [int(getattr(regs, name)) for name in _GREGS_ORDER]
        orig_rax, rax = _signed(int(regs.orig_rax)), _signed(int(regs.rax))
        rip_index, rax_index = _GREGS_ORDER.index("rip"), _GREGS_ORDER.index("rax")
        if orig_rax >= 0 and rax in _RESTART_SAME:
            values[rax_index], values[rip_index] = orig_rax, values[rip_index] - 2
        elif orig_rax >= 0 and rax == _RESTART_BLOCK:
            values[rax_index], values[rip_index] = _SYS_RESTART_SYSCALL, values[rip_index] - 2
        data = struct.pack("<Q", resume_ip) + b"".join(
            struct.pack("<Q", v & arch.U64) for v in values
        )
        memory.write_code(self.base + LABELS["injection_resume"], data, tid)

    def returned(self, memory: TraceeMemory, tid: int) -> None:
        """The lent thread has its own registers back."""
        self._write_u64(memory, tid, LABELS["injection_resume"], 0)

    def _write_u64(self, memory: TraceeMemory, tid: int, offset: int, value: int) -> None:
        memory.write_code(self.base + offset, struct.pack("<Q", value & arch.U64), tid)


class GuardedInjector(SyscallInjector):
    """SyscallInjector that leaves a borrowed thread as it found it even if probescope dies:
    while the thread runs the call the registers it must resume with are in the switch's area
    (the handler restores them from the step trap), and after it the thread waits in an
    interrupt stop, whose end asks nothing of a tracer (a step-trap stop would leave the
    thread single-stepping once nobody traces it). The caller's view of the thread's
    registers (`thread.regs`, which a hit may have changed locally) is kept."""

    def run(self, thread: Thread, number: int, *args: int) -> int:
        held = thread.regs.copy()
        result = super().run(thread, number, *args)
        if not thread.pending_signal:
            interrupt_stop(thread)
        thread.regs.assign(held)
        return result

    def _lending(self, thread: Thread, resume_ip: int, regs: arch.Registers) -> None:
        switch = thread.process.switch
        if switch is not None:
            switch.lend(thread.process.memory, thread.tid, resume_ip, regs)

    def _returned(self, thread: Thread) -> None:
        switch = thread.process.switch
        if switch is not None:
            switch.returned(thread.process.memory, thread.tid)


def interrupt_stop(thread: Thread) -> None:
    """Move a thread from a signal-delivery stop into an interrupt stop (PTRACE_INTERRUPT,
    then PTRACE_CONT: it stops again before running an instruction)."""
    tid = thread.tid
    try:
        syscalls.interrupt(tid)
        syscalls.cont(tid)
    except PtraceError:
        return
    _, status = os.waitpid(tid, syscalls.WALL)
    thread.stop_status = status
    if syscalls.stopped(status) and syscalls.stop_event(status) == 0:
        # a signal was queued meanwhile: its stop comes first; it is delivered on resume
        thread.pending_signal = syscalls.stop_signal(status)


def default_signals(tgid: int) -> frozenset[int]:
    """Which of SIGNALS the process leaves at their default action (not caught, not ignored)."""
    fields = procfs.status_fields(tgid)
    try:
        taken = int(fields.get("SigCgt", "0"), 16) | int(fields.get("SigIgn", "0"), 16)
    except ValueError:
        return frozenset()
    return frozenset(s for s in SIGNALS if not taken & (1 << (s - 1)))


def leftover_areas(memory: TraceeMemory, mappings: list[Mapping]) -> list[int]:
    """Areas a probescope killed earlier left in the process (found by their magic)."""
    found = []
    for m in mappings:
        if m.inode or m.path or not m.executable or m.end - m.start != AREA_SIZE:
            continue
        if memory.read(m.start, len(MAGIC)) == MAGIC:
            found.append(m.start)
    return found


def reclaim(memory: TraceeMemory, tid: int, base: int) -> int:
    """Put back the original bytes of every site a killed probescope's area still lists (where
    its trap bytes still are) and empty its site table; returns how many sites were restored.
    Its return table stays: threads may still return through its trampoline."""
    count = memory.read_word(base + LABELS["site_count"]) or 0
    restored = 0
    for index in range(min(count, SITE_CAPACITY)):
        entry = memory.read(base + _SITES + index * _SITE_SIZE, _SITE_SIZE)
        if len(entry) != _SITE_SIZE or not 1 <= entry[31] <= arch.MAX_INSTRUCTION:
            continue
        address = struct.unpack_from("<Q", entry)[0]
        original = entry[16 : 16 + entry[31]]
        if memory.read(address, 1) in (arch.BREAKPOINT, arch.HALT):
            try:
                memory.write_code(address, original, tid)
                restored += 1
            except PtraceError:
                continue
    memory.write_code(base + LABELS["site_count"], struct.pack("<Q", 0), tid)
    return restored


def arm(
    thread: Thread,
    injector: SyscallInjector,
    mappings: list[Mapping],
    area: Callable[[int], int],
    pinned: tuple[int, set[int]] | None,
    owner: int,
) -> str | None:
    """Map and fill a switch area in the thread's address space and install its handler
    (`process.switch`, set as soon as the area exists, so that a detach that cuts this short
    finds whatever was done); a sentence saying why not when the program handles SIGTRAP
    itself or the kernel refuses the handler.

    `area(size)` maps an r-x area (an injected mmap); `pinned` is (the CPU the tracer pins
    threads to, their own CPUs) when it does."""
    process = thread.process
    memory = process.memory
    earlier = leftover_areas(memory, mappings)
    for base in earlier:
        reclaim(memory, thread.tid, base)
    free = default_signals(thread.tgid)
    if earlier:
        free |= _signals_held_by(thread, injector, earlier)
    if signal.SIGTRAP not in free:
        return (
            f"process {thread.tgid} handles SIGTRAP itself: if probescope is killed without "
            "detaching, its probes stay in and the next hit ends it"
        )
    base = area(AREA_SIZE)
    switch = process.switch = DeadMansSwitch(base, frozenset())
    tid = thread.tid
    memory.write_code(base, IMAGE, tid)
    header = struct.pack("<Q", owner)
    memory.write_code(base + LABELS["owner"], header, tid)
    if earlier:
        memory.write_code(base + LABELS["previous"], struct.pack("<Q", earlier[-1]), tid)
        for newer, older in zip(earlier[1:], earlier, strict=False):
            memory.write_code(newer + LABELS["previous"], struct.pack("<Q", older), tid)
    if pinned is not None:
        cpu, own = pinned
        masks = struct.pack("<Q", MASK_BYTES) + _mask_bytes([cpu]) + _mask_bytes(sorted(own))
        memory.write_code(base + LABELS["mask_size"], masks, tid)
    action = base + LABELS["action"]
    memory.write_code(action, struct.pack("<Q", base + LABELS["handler"]), tid)
    memory.write_code(action + 16, struct.pack("<Q", base + LABELS["restorer"]), tid)
    for signum in sorted(free):
        if injector.run(thread, SYS_RT_SIGACTION, signum, action, 0, 8) == 0:
            switch.signals |= {signum}
    if not switch.armed:
        return f"process {thread.tgid}: the kernel refused the switch's SIGTRAP handler"
    return None


def _signals_held_by(thread: Thread, injector: SyscallInjector, areas: list[int]) -> frozenset[int]:
    """Which of SIGNALS a killed probescope's handler (in one of `areas`) still holds."""
    held = set()
    for signum in SIGNALS:
        handler = current_handler(thread, injector, signum)
        if handler is not None and any(a <= handler < a + AREA_SIZE for a in areas):
            held.add(signum)
    return frozenset(held)


def current_handler(thread: Thread, injector: SyscallInjector, signum: int) -> int | None:
    """The handler address installed for `signum` (0 for the default action), read with an
    injected rt_sigaction into dead stack memory below the thread's red zone."""
    buffer = _stack_buffer(thread)
    if buffer is None:
        return None
    if injector.run(thread, SYS_RT_SIGACTION, signum, 0, buffer, 8) != 0:
        return None
    return thread.process.memory.read_word(buffer)


def disarm(switch: DeadMansSwitch, thread: Thread, injector: SyscallInjector) -> bool:
    """Give every signal the switch handles back to its default action — or to the program's
    own handler if it installed one over ours meanwhile. True when done."""
    buffer = _stack_buffer(thread)
    if buffer is None:
        return False
    memory = thread.process.memory
    ours = switch.base + LABELS["handler"]
    default = switch.base + LABELS["default_action"]
    done = True
    for signum in sorted(switch.signals):
        if injector.run(thread, SYS_RT_SIGACTION, signum, default, buffer, 8) != 0:
            done = False
            continue
        previous = memory.read_word(buffer)
        if previous is not None and previous != ours:
            injector.run(thread, SYS_RT_SIGACTION, signum, buffer, 0, 8)
    return done


def _stack_buffer(thread: Thread) -> int | None:
    """An address for a struct sigaction below the thread's stack pointer and red zone."""
    regs = arch.Registers()
    try:
        syscalls.RegisterSet(regs).fetch(thread.tid)
    except PtraceError:
        return None
    address = (int(regs.rsp) - _RED_ZONE - 2 * _SIGACTION_SIZE) & ~15
    if thread.process.memory.read_exact(address, _SIGACTION_SIZE) is None:
        return None
    return address
