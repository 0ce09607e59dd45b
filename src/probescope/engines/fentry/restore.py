"""Putting a process back as it was, from what its own memory says.

Used at detach, for fork children the engine never saw, after a probescope that was SIGKILLed
(the next run, or `probescope cleanup -p PID`), so it trusts no bookkeeping of ours: it finds
the code areas by their magic in anonymous r-x mappings, reads each area's site table and
header, and while every thread is stopped:
1. writes each site's original bytes back where the jump still is;
2. puts back every return address a live thread's shadow stack hijacked;
3. tells the stubs no tracer serves handshakes any more;
4. unmaps the areas, the thread state and the ring — unless a thread's pc or a word on a
   thread's stack (a signal frame, a pending return) still points into an area: then they
   stay, harmless, with the ring counting drops.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from probescope.engines.fentry import inject as injecting
from probescope.engines.fentry.area import (
    HEADER_SIZE,
    SITE_ENTRY,
    capacity_for,
    common_offset,
    parse_header,
    parse_site_rows,
)
from probescope.engines.fentry.relocate import jump
from probescope.engines.fentry.templates import CONSTANTS, TEMPLATES
from probescope.engines.fentry.world import StoppedProcess
from probescope.engines.ptrace import xol
from probescope.errors import PtraceError

_THREADS = CONSTANTS["THREADS"]
_ENTRY = CONSTANTS["THREAD_ENTRY"]
_FRAME = CONSTANTS["FRAME_SIZE"]
_DEPTH_LIMIT = CONSTANTS["MAX_DEPTH"]
_FRAMES_OFFSET = CONSTANTS["FRAMES_OFFSET"]
_FRAMES_PER_THREAD = 1 << CONSTANTS["FRAMES_PER_THREAD_SHIFT"]
_CHAINED = CONSTANTS["FRAME_CHAINED"]
_RING_STATE = CONSTANTS["RING_STATE"]
_TRAMPOLINE_OFFSET = TEMPLATES["common"].symbols["return_trampoline"]
_MAX_STACK_SCAN = 8 << 20


@dataclass
class FoundArea:
    start: int
    size: int
    header: dict[str, int]

    def contains(self, address: int) -> bool:
        return self.start <= address < self.start + self.size


@dataclass
class RestoreReport:
    sites: int = 0
    returns: int = 0
    unmapped: bool = False
    kept_because: str | None = None
    notes: list[str] = field(default_factory=list)


def find_areas(world: StoppedProcess) -> list[FoundArea]:
    """Every code area of ours (any owner) mapped in the process."""
    found = []
    memory = world.space.memory
    for mapping in world.space.mappings():
        if mapping.perms != "r-xp" or mapping.inode or mapping.path:
            continue
        header = parse_header(memory.read(mapping.start, HEADER_SIZE))
        if header is not None:
            found.append(FoundArea(mapping.start, mapping.end - mapping.start, header))
    return found


def restore(
    world: StoppedProcess,
    injector: xol.SyscallInjector,
    owned: Callable[[dict[str, int]], bool],
    *,
    unmap: bool = True,
) -> RestoreReport:
    """Undo the areas `owned(header)` accepts, in a process whose threads are all stopped."""
    report = RestoreReport()
    areas = [a for a in find_areas(world) if owned(a.header)]
    if not areas:
        return report
    memory = world.space.memory
    tid = next(iter(world.threads))
    for area in areas:
        count = min(area.header["sites"], area.header["capacity"])
        rows = parse_site_rows(memory.read(area.start + HEADER_SIZE, count * SITE_ENTRY), count)
        for index, (address, length, original, patched) in enumerate(rows):
            if not patched:
                continue
            stub = struct.unpack_from(
                "<Q", memory.read(area.start + HEADER_SIZE + index * SITE_ENTRY + 16, 8)
            )[0]
            ours = jump(address, stub) + b"\xcc" * (length - 5)
            live = memory.read(address, length)
            if live == ours:
                memory.write_code(address, original, tid)
                report.sites += 1
            elif live != original and live:
                report.notes.append(
                    f"bytes at {address:#x} changed since they were patched: left alone"
                )
    trampolines = {a.header["trampoline"] for a in areas} | {_own_trampoline(a) for a in areas}
    states = {a.header["state"] for a in areas if a.header["state"]}
    for state in states:
        report.returns += _restore_returns(world, state, trampolines)
    for ring in {a.header["ring"] for a in areas if a.header["ring"]}:
        memory.write_data(ring + _RING_STATE, struct.pack("<I", 0))
    if not unmap:
        return report
    reason = _still_referenced(world, areas)
    if reason is not None:
        report.kept_because = reason
        return report
    inject = injecting.Injector(world, injector)
    try:
        for area in areas:
            injecting.unmap(inject, area.start, area.size)
        for state in states:
            injecting.unmap(inject, state, injecting.STATE_SIZE)
        for area in areas:
            ring, size = area.header["ring"], area.header["ring_size"]
            if ring and size and _mapped(world, ring):
                injecting.unmap(inject, ring, size)
        report.unmapped = True
    except PtraceError as error:
        report.notes.append(f"areas left mapped: {error.message}")
    finally:
        inject.finish()
    return report


def _own_trampoline(area: FoundArea) -> int:
    return area.start + common_offset(capacity_for(area.size)) + _TRAMPOLINE_OFFSET


def _restore_returns(world: StoppedProcess, state: int, trampolines: set[int]) -> int:
    """Real return addresses back for every live thread of this process."""
    memory = world.space.memory
    table = memory.read(state, _THREADS * _ENTRY)
    restored = 0
    live = set(world.threads)
    for index in range(len(table) // _ENTRY):
        tid, pid, tcb, depth = struct.unpack_from("<IIQI", table, index * _ENTRY)
        if not tcb or not depth or tid not in live or pid != world.pid:
            continue
        depth = min(depth, _DEPTH_LIMIT)
        frames = memory.read(state + _FRAMES_OFFSET + index * _FRAMES_PER_THREAD, depth * _FRAME)
        for number in range(len(frames) // _FRAME):
            stack, original, _site, flags = struct.unpack_from("<QQII", frames, number * _FRAME)
            if flags & _CHAINED:
                continue
            if memory.read_word(stack) in trampolines and memory.write_data(
                stack, struct.pack("<Q", original)
            ):
                restored += 1
    return restored


def _mapped(world: StoppedProcess, address: int) -> bool:
    return any(m.start <= address < m.end for m in world.space.mappings())


def _still_referenced(world: StoppedProcess, areas: list[FoundArea]) -> str | None:
    for thread in world.threads.values():
        try:
            world.registers(thread)
        except PtraceError:
            continue
        pc = int(thread.regs.rip)
        if any(a.contains(pc) for a in areas):
            return f"thread {thread.tid} is running code in it"
        if _stack_refers(world, int(thread.regs.rsp), areas):
            return f"thread {thread.tid}'s stack refers to it (a signal frame or a pending return)"
    return None


def _stack_refers(world: StoppedProcess, sp: int, areas: list[FoundArea]) -> bool:
    memory = world.space.memory
    mapping = next((m for m in world.space.mappings() if m.start <= sp < m.end), None)
    if mapping is None:
        return False
    end = min(mapping.end, sp + _MAX_STACK_SCAN)
    cursor = max(sp & ~7, mapping.start)
    ranges = [(a.start, a.start + a.size) for a in areas]
    # words pointing into an area share their top five bytes with its start or its end:
    # find those byte patterns instead of unpacking every word
    patterns = {
        (address >> 24).to_bytes(5, "little") for r in ranges for address in (r[0], r[1] - 1)
    }
    while cursor < end:
        data = memory.read(cursor, min(1 << 20, end - cursor))
        if not data:
            return True
        for pattern in patterns:
            at = data.find(pattern)
            while at >= 0:
                word_at = at - 3
                if word_at >= 0 and word_at % 8 == 0 and word_at + 8 <= len(data):
                    (word,) = struct.unpack_from("<Q", data, word_at)
                    if any(low <= word < high for low, high in ranges):
                        return True
                at = data.find(pattern, at + 1)
        cursor += len(data)
    return False
