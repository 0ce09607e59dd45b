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
from probescope.engines.ptrace import dead_mans_switch, returns, stepping, syscalls
from probescope.engines.ptrace.tracee import AddressSpace, Breakpoint, Thread
from probescope.engines.ptrace.xol import SyscallInjector
from probescope.errors import ProcessError, PtraceError
from probescope.system.maps import Mapping

_MAX_STACK_SCAN = 8 << 20


def settle(thread: Thread, info: syscalls.SigInfo | None) -> None:
    """Make a stopped thread's registers independent of our breakpoints and XOL pages, and
    set `pending_signal` to what detaching must deliver. Reads the kernel's state — the
    registers, and `info`, the siginfo of the stop the thread is in now (None when it has
    none) — rather than trusting bookkeeping that an exception may have cut short."""
    tid = thread.tid
    trap = info is not None and info.code == syscalls.SI_KERNEL
    # The tracer had taken this stop as one of its traps (the flag may lag by a resume: it
    # counts only for a trap's stop, never for a signal sent to the program).
    ours = thread.serving and trap
    try:
        if thread.injection_regs is not None:
            thread.regs.assign(thread.injection_regs)
            thread.injection_regs = None
            thread.regset.store(tid)
            syscalls.set_sigmask(tid, thread.injection_mask)
            ours = True  # the stop of our injected system call's step
        thread.regset.fetch(tid)
    except PtraceError:
        return
    regs = thread.regs
    process = thread.process
    changed = False
    if thread.step is not None:
        step = thread.step
        if int(regs.rip) == step.slot:
            stepping.abort(thread)  # the copy has not run: back to the probe site
        else:
            thread.step = None
            stepping.fix_up(thread, step)
        changed = ours = True
    int3 = trap and info is not None and info.signo == signal.SIGTRAP
    rip = int(regs.rip)
    bp = process.trapped_at(rip)
    if bp is not None and (not bp.ambiguous or int3):
        regs.rip = bp.address  # stopped on our trap, not yet served: run the original instead
        changed = True
        ours = ours or trap
    elif rip - arch.TRAP_IP_ADVANCE == process.trampoline and thread.shadow:
        regs.rip = returns.returned(thread)[0]
        changed = True
        ours = ours or trap
    rip = int(regs.rip)
    if process.in_xol(rip):
        resolved = out_of_slot(process, rip)
        if resolved is not None:
            regs.rip = resolved
            changed = True
    if changed:
        thread.regset.store(tid)
    if info is not None and signal_delivery(info) and not ours and not thread.pending_signal:
        thread.pending_signal = info.signo  # the program's own signal: it gets it


def reblock(thread: Thread) -> None:
    """Block again the signals we unblocked in the thread (tracer_state._unblock_traps)."""
    if not thread.unblocked:
        return
    try:
        syscalls.set_sigmask(thread.tid, syscalls.get_sigmask(thread.tid) | thread.unblocked)
    except PtraceError:
        return
    thread.unblocked = 0


def signal_delivery(info: syscalls.SigInfo) -> bool:
    """Whether a stop is a signal-delivery stop (its signal is the program's unless it is one
    of our traps), not an event, interrupt or group stop (si_code = signal | event << 8)."""
    return not (info.code >> 8 and info.code & 0xFF == info.signo)


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
    """Original bytes back wherever our trap still is in the file's mapping; then the dead
    man's switch has no site left to look after."""
    try:
        mappings = process.mappings()
    except ProcessError:
        mappings = []
    for bp in process.breakpoints.values():
        if not still_mapped(bp, mappings):
            continue
        if process.memory.read(bp.address, 1) == bp.trap[:1]:
            try:
                process.memory.write_code(
                    bp.address, bp.instruction.raw[: len(bp.trap)], stopped.tid
                )
            except PtraceError as error:
                notes.append(error.message)
    if process.switch is not None:
        try:
            process.switch.clear_sites(process.memory, stopped.tid)
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


def release_areas(
    process: AddressSpace, threads: list[Thread], stopped: Thread, injector: SyscallInjector
) -> bool:
    """Uninstall the dead man's switch and munmap our pages, unless something still points
    into them once stacked pcs were moved out of our slots (a return through the trampoline
    that could not be put back, a thread inside the switch's handler): then they stay,
    harmless (the switch, with no site left, only serves returns through the trampoline).
    True when released."""
    if stopped.process is not process:
        return False
    for thread in threads:
        if process.ours(int(thread.regs.rip)) or stack_refers_to_xol(process, thread):
            return False
    switch = process.switch
    try:
        if switch is not None:
            if not dead_mans_switch.disarm(switch, stopped, injector):
                return False
            process.switch = None
            injector.run(stopped, arch.SYS_MUNMAP, switch.base, dead_mans_switch.AREA_SIZE)
        for start, size in process.xol_areas:
            injector.run(stopped, arch.SYS_MUNMAP, start, size)
    except PtraceError:
        return False
    process.xol_areas.clear()
    return True


def stack_refers_to_xol(process: AddressSpace, thread: Thread) -> bool:
    """Any word from sp to the end of its mapping that points into our pages (the switch's
    area included), once stacked pcs in our slots were moved out of them. Live return
    addresses and signal frames are at or above sp; the red zone below only holds dead copies
    (a returned-from trampoline slot, for instance).

    A stacked pc inside a slot gets the address the thread would reach from it, as settle()
    does for the thread's own ip: the pc a signal interrupted in a slot (saved in its handler's
    signal frame, which sigreturn resumes from) goes to the original instruction (the copy had
    not run) or past it (the jump back had not); a return address pushed by a call run from a
    slot, to the call's own return address. The original bytes are back by then. Words that
    resolve nowhere (the trampoline) stay, and so do our pages."""
    sp = int(thread.regs.rsp)
    try:
        mapping = next((m for m in process.mappings() if m.start <= sp < m.end), None)
    except ProcessError:
        return True
    if mapping is None:
        return True
    end = min(mapping.end, sp + _MAX_STACK_SCAN)
    cursor = max(sp & ~7, mapping.start)
    refers = False
    while cursor < end:
        data = process.memory.read(cursor, min(65536, end - cursor))
        if not data:
            return True
        for index, (word,) in enumerate(struct.iter_unpack("<Q", data[: len(data) & ~7])):
            if process.ours(word) and not _move_out_of_slot(process, cursor + 8 * index, word):
                refers = True
        cursor += len(data)
    return refers


def _move_out_of_slot(process: AddressSpace, address: int, word: int) -> bool:
    """Rewrite the stacked pc `word` at `address` to where it leads out of our slots; False
    when it leads nowhere (or the write fails)."""
    if not process.in_xol(word):
        return False
    resolved = out_of_slot(process, word)
    if resolved is None or process.ours(resolved):
        return False
    return process.memory.write_data(address, struct.pack("<Q", resolved))
