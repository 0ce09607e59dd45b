"""Execute-out-of-line pages: injected into the tracee with a borrowed `syscall` instruction.

A page is mapped near the probed module (within ±2 GiB, so RIP-relative operands and `jmp rel32`
reach) by making one stopped thread execute `mmap` (mechanisms.md §4.4): its registers are
saved, pointed at a `syscall` found in the vDSO, single-stepped once, and restored unchanged —
an interrupted system call then restarts normally. Slots are handed out from those pages; the
first slot of the first page is the return trampoline (one int3).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import syscalls
from probescope.engines.ptrace.tracee import AddressSpace, Thread
from probescope.errors import PtraceError
from probescope.system import procfs
from probescope.system.maps import Mapping, gaps

_REACH = (1 << 31) - 4 * arch.SLOT_SIZE
_LOWEST = 0x10000
_HIGHEST = 0x7FFFFFFFF000
_EEXIST = 17
_STACK_GUARD = 1 << 21


class SyscallInjector:
    """Runs one system call inside a stopped tracee thread."""

    def __init__(self) -> None:
        self._syscall_sites: dict[int, int] = {}
        self.steps = 0

    def forget(self, process: AddressSpace) -> None:
        self._syscall_sites.pop(id(process), None)

    def run(self, thread: Thread, number: int, *args: int) -> int:
        process = thread.process
        site = self._syscall_sites.get(id(process))
        if site is None:
            site = find_syscall_instruction(process)
            self._syscall_sites[id(process)] = site
        tid = thread.tid
        thread.regset.fetch(tid)
        saved = thread.regs.copy()
        thread.injection_regs = saved
        call = saved.copy()
        arch.set_syscall(call, site, number, *args)
        done = site + len(arch.SYSCALL_INSTRUCTION)
        try:
            for _ in range(16):
                # (Re)load the call: a stop can come before the syscall runs — the first step
                # after an exec stop traps at once, and execve's return value overwrites rax.
                thread.regs.assign(call)
                thread.regset.store(tid)
                syscalls.singlestep(tid)
                self.steps += 1
                _, status = os.waitpid(tid, syscalls.WALL)
                if not syscalls.stopped(status):
                    raise PtraceError(
                        f"thread {tid} ended while running an injected system call "
                        f"({syscalls.describe_status(status)})"
                    )
                sig = syscalls.stop_signal(status)
                if syscalls.stop_event(status) == 0 and sig != signal.SIGTRAP:
                    # A signal arrived before the syscall ran: hand it on after we are done.
                    thread.pending_signal = sig
                    continue
                thread.regset.fetch(tid)
                if thread.regs.rip == done:
                    break
                if thread.regs.rip != site:
                    raise PtraceError(
                        f"injected system call in thread {tid} went astray "
                        f"(ip 0x{thread.regs.rip:x})"
                    )
            else:
                raise PtraceError(f"injected system call in thread {tid} did not run")
            result = arch.syscall_result(thread.regs)
        finally:
            if syscalls.stopped(thread.stop_status) and (
                syscalls.stop_event(thread.stop_status) == syscalls.PTRACE_EVENT_EXEC
            ):
                saved.rax = 0  # execve's return value, written after its event stop
            thread.regs.assign(saved)
            thread.regset.store(tid)
            thread.injection_regs = None
        return result


def find_syscall_instruction(process: AddressSpace) -> int:
    """The address of a `syscall` instruction: the vDSO first, then any executable mapping."""
    mappings = process.mappings()
    ordered = [m for m in mappings if m.path == "[vdso]"]
    ordered += [m for m in mappings if m.executable and m.path != "[vdso]" and m.path]
    for mapping in ordered:
        cursor = mapping.start
        end = min(mapping.end, mapping.start + (1 << 20))
        while cursor < end:
            chunk = process.memory.read(cursor, min(65536, end - cursor) + 1)
            if not chunk:
                break
            found = chunk.find(arch.SYSCALL_INSTRUCTION)
            if found >= 0:
                return cursor + found
            cursor += max(len(chunk) - 1, 1)
    raise PtraceError(
        f"no `syscall` instruction found in process {process.tgid} to inject the XOL page with"
    )


def candidate_starts(
    mappings: list[Mapping],
    low: int,
    high: int,
    size: int,
    stack_limit: int | None = None,
    executable: tuple[int, int] | None = None,
) -> Iterator[int]:
    """Page-aligned starts for a `size`-byte area that keeps every address in [low, high)
    within ±2 GiB of every slot, least disturbing first.

    The program's own layout must not move: mmap hands out addresses top-down from below the
    stack gap, brk grows up after the executable, the stack grows down. So the first choice is
    the bottom of the stack gap (above every mmap, below the stack's rlimit), the next ones
    sit just below a mapping (below the executable nothing is ever allocated), nearest first;
    never in the gap after the executable (or [heap]), where brk grows.
    """
    window_low = max(_LOWEST, high - _REACH)
    window_high = min(_HIGHEST, low + _REACH)
    stack = next((m for m in mappings if m.path == "[stack]"), None)
    if stack is not None and stack_limit is not None:
        below_stack = max((m.end for m in mappings if m.end <= stack.start), default=None)
        if below_stack is not None:
            start = below_stack + 4096
            ceiling = stack.start - stack_limit - _STACK_GUARD
            if start + size <= ceiling and window_low <= start and start + size <= window_high:
                yield start
    brk_floors = {m.end for m in mappings if m.path == "[heap]"}
    if executable is not None:
        brk_floors.add(max((m.end for m in mappings if m.file_key == executable), default=-1))
    candidates = []
    for gap_low, gap_high in gaps(mappings, window_low, window_high):
        if gap_low in brk_floors:
            continue
        gap_low = (gap_low + 0xFFF) & ~0xFFF
        gap_high &= ~0xFFF
        if gap_high - gap_low < size + 2 * 4096:
            continue
        if stack is not None and gap_high == stack.start:
            continue  # the stack grows into this gap
        # One guard page between us and the neighbouring mapping.
        start = gap_high - size - 4096 if gap_high <= low else gap_low + 4096
        candidates.append((gap_high > low, abs(start - low), start))
    for _, _, start in sorted(candidates):
        yield start


def allocate_area(
    injector: SyscallInjector, thread: Thread, low: int, high: int, size: int
) -> tuple[int, bool]:
    """Map a `size`-byte r-x area near [low, high); (start, within reach)."""
    process = thread.process
    mappings = process.mappings()
    executable = procfs.executable_key(thread.tgid)
    limit = procfs.stack_limit(thread.tgid)
    for start in candidate_starts(mappings, low, high, size, limit, executable):
        result = injector.run(
            thread,
            arch.SYS_MMAP,
            start,
            size,
            arch.PROT_READ_EXEC,
            arch.MAP_PRIVATE_ANONYMOUS_FIXED_NOREPLACE,
            -1,
            0,
        )
        if result == -_EEXIST:
            continue
        if result < 0:
            break
        if result != start:
            injector.run(thread, arch.SYS_MUNMAP, result, size)
            continue
        return result, True
    result = injector.run(thread, arch.SYS_MMAP, 0, size, arch.PROT_READ_EXEC, 0x22, -1, 0)
    if result < 0:
        raise PtraceError(
            f"cannot map an execute-out-of-line page in process {process.tgid}: "
            f"mmap failed with {syscalls.error_text(-result)}"
        )
    return result, False


def in_reach(slot: int, address: int) -> bool:
    return abs(slot - address) < _REACH


def take_slot(process: AddressSpace, near: int | None) -> int | None:
    """A free slot in an existing area (within reach of `near` when given)."""
    for start, size in process.xol_areas:
        used = process.xol_used[start]
        if used + arch.SLOT_SIZE > size:
            continue
        slot = start + used
        if near is not None and not in_reach(slot, near):
            continue
        process.xol_used[start] = used + arch.SLOT_SIZE
        return slot
    return None


def add_area(process: AddressSpace, start: int, size: int) -> None:
    process.xol_areas.append((start, size))
    process.xol_used[start] = 0
