"""Putting a tracee back as it was: registers out of our slots and int3s, original bytes,
original return addresses, and our XOL pages unmapped when nothing points into them.

Each step reads the real state (registers from the kernel, bytes from memory, the current maps)
rather than trusting bookkeeping, so it also repairs a tracee caught mid-hit by a detach from a
signal handler.
"""

from __future__ import annotations

import signal
import struct

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import returns, stepping, syscalls
from probescope.engines.ptrace.tracee import AddressSpace, Breakpoint, Thread
from probescope.engines.ptrace.xol import SyscallInjector
from probescope.errors import ProcessError, PtraceError
from probescope.system.maps import Mapping

_MAX_STACK_SCAN = 8 << 20


def settle(thread: Thread) -> None:
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
        stepping.abort(thread)
        changed = True
    address = int(regs.rip) - arch.TRAP_IP_ADVANCE
    unserved = syscalls.stopped(thread.stop_status) and (thread.stop_status >> 8 == signal.SIGTRAP)
    if unserved and address in process.breakpoints:
        regs.rip = address  # stopped on our int3, not yet served: run the original instead
        changed = True
    elif unserved and address == process.trampoline and thread.shadow:
        regs.rip = returns.returned(thread)[0]
        changed = True
    rip = int(regs.rip)
    if process.in_xol(rip):
        resolved = out_of_slot(process, rip)
        if resolved is not None:
            regs.rip = resolved
            changed = True
    if changed:
        thread.regset.store(tid)


def out_of_slot(process: AddressSpace, rip: int) -> int | None:
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


def still_mapped(bp: Breakpoint, mappings: list[Mapping]) -> bool:
    """Whether bp's address still shows the same file offset of the same file."""
    for m in mappings:
        if m.start <= bp.address < m.end:
            return m.file_key == bp.mapping_key and m.address_of(bp.file_offset) == bp.address
    return False


def restore_text(process: AddressSpace, stopped: Thread, notes: list[str]) -> None:
    """Original bytes back wherever our int3 still is in the file's mapping."""
    try:
        mappings = process.mappings()
    except ProcessError:
        mappings = []
    for bp in process.breakpoints.values():
        if not still_mapped(bp, mappings):
            continue
        if process.memory.read(bp.address, 1) == arch.BREAKPOINT:
            try:
                process.memory.write_code(bp.address, bp.instruction.raw[:1], stopped.tid)
            except PtraceError as error:
                notes.append(error.message)


def restore_semaphores(process: AddressSpace) -> None:
    """Take back our increments of USDT semaphores."""
    for address, count in process.semaphores.items():
        process.memory.add_u16(address, -count)
    process.semaphores.clear()


def can_inject(thread: Thread) -> bool:
    """Whether the thread's stop lets it run an injected system call: a signal-delivery stop
    or an interrupt/group stop — not an event stop inside a system call (clone, fork, exit),
    whose result the kernel writes into the registers only after the stop."""
    status = thread.stop_status
    if thread.running or not syscalls.stopped(status):
        return False
    return syscalls.stop_event(status) in (0, syscalls.PTRACE_EVENT_STOP)


def release_xol(
    process: AddressSpace, threads: list[Thread], stopped: Thread, injector: SyscallInjector
) -> bool:
    """munmap our pages unless something still points into them (a stacked return address, a
    signal frame): then they stay, harmless. True when unmapped."""
    if not process.xol_areas or stopped.process is not process:
        return False
    for thread in threads:
        if process.in_xol(int(thread.regs.rip)) or stack_refers_to_xol(process, thread):
            return False
    for start, size in process.xol_areas:
        try:
            injector.run(stopped, arch.SYS_MUNMAP, start, size)
        except PtraceError:
            return False
    process.xol_areas.clear()
    return True


def stack_refers_to_xol(process: AddressSpace, thread: Thread) -> bool:
    """Any word from sp to the end of its mapping that points into our pages. Live return
    addresses and signal frames are at or above sp; the red zone below only holds dead copies
    (a returned-from trampoline slot, for instance)."""
    sp = int(thread.regs.rsp)
    try:
        mapping = next((m for m in process.mappings() if m.start <= sp < m.end), None)
    except ProcessError:
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
