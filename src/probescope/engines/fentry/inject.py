"""Mappings the engine makes the traced program create, through injected system calls.

- code areas (read+execute, private, anonymous), within ±2 GiB of the code they serve, placed
  where the ptrace engine places its XOL pages (xol.allocate_area: out of the way of the
  program's own mmap, brk and stack growth, so its layout is what it would be untraced);
- the thread state (read+write, private: a fork child gets a copy, as the kernel copies a
  task's pending return instances) and the ring (a memfd mapped shared, which the tracer maps
  too), both far from everything the program allocates (above 32 TiB, below the mmap area).
Every system call runs in one stopped thread with borrowed registers (SyscallInjector).
"""

from __future__ import annotations

import os

from probescope.engines.fentry.area import CodeArea, Owner, area_size
from probescope.engines.fentry.ring import Ring, ring_bytes
from probescope.engines.fentry.templates import CONSTANTS
from probescope.engines.fentry.world import StoppedProcess
from probescope.engines.ptrace import syscalls, xol
from probescope.engines.ptrace.tracee import Thread
from probescope.errors import PtraceError
from probescope.system import procfs
from probescope.system.maps import gaps

SYS_CLOSE = 3
SYS_MMAP = 9
SYS_MUNMAP = 11
SYS_FTRUNCATE = 77
SYS_MEMFD_CREATE = 319
PROT_READ_WRITE = 0x3
MAP_SHARED = 0x01
MAP_PRIVATE_ANONYMOUS = 0x22
MAP_FIXED_NOREPLACE = 0x100000
MAP_POPULATE = 0x8000
MFD_CLOEXEC = 0x1
MFD_NOEXEC_SEAL = 0x8
_EEXIST = 17
_EINVAL = 22
_FAR_LOW = 0x200000000000
_FAR_HIGH = 0x600000000000
_GUARD = 1 << 20

STATE_SIZE = CONSTANTS["FRAMES_OFFSET"] + CONSTANTS["THREADS"] * (
    1 << CONSTANTS["FRAMES_PER_THREAD_SHIFT"]
)


class Injector:
    """System calls in one process's stopped threads, for one transaction."""

    def __init__(self, world: StoppedProcess, injector: xol.SyscallInjector) -> None:
        self.world = world
        self.syscalls = injector
        self.thread: Thread = world.injectable()
        self.used = False

    def call(self, number: int, *args: int) -> int:
        """Run one system call; the thread goes back to an interrupt stop right after it, so
        the window in which a killed tracer would leave a SIGTRAP behind stays microseconds."""
        self.used = True
        try:
            return self.syscalls.run(self.thread, number, *args)
        finally:
            self.finish()

    def finish(self) -> None:
        """Leave the borrowed thread in an interrupt stop (see StoppedProcess.settle)."""
        if self.used:
            self.world.settle(self.thread)
            self.used = False

    def fail(self, what: str, result: int) -> PtraceError:
        return PtraceError(
            f"{what} in process {self.world.pid} failed: {syscalls.error_text(-result)}"
        )


def map_area(inject: Injector, low: int, high: int, sites: int) -> tuple[int, int] | None:
    """(start, size) of a new r-x area within reach of [low, high); None when none is free."""
    size = area_size(sites)
    start, reachable = xol.allocate_area(inject.syscalls, inject.thread, low, high, size)
    inject.used = True
    inject.finish()
    if not reachable:
        inject.call(SYS_MUNMAP, start, size)
        return None
    return start, size


def map_far(inject: Injector, size: int, prot: int, flags: int, fd: int = -1) -> int:
    """Map `size` bytes far from the program's own allocations."""
    mappings = inject.world.space.mappings()
    for gap_low, gap_high in gaps(mappings, _FAR_LOW, _FAR_HIGH):
        start = (gap_low + _GUARD + 0xFFF) & ~0xFFF
        if start + size + _GUARD > gap_high:
            continue
        result = inject.call(SYS_MMAP, start, size, prot, flags | MAP_FIXED_NOREPLACE, fd, 0)
        if result == -_EEXIST:
            continue
        if result < 0:
            raise inject.fail("mmap", result)
        if result != start:  # a kernel without MAP_FIXED_NOREPLACE treats it as a hint
            inject.call(SYS_MUNMAP, result, size)
            continue
        return result
    result = inject.call(SYS_MMAP, 0, size, prot, flags, fd, 0)
    if result < 0:
        raise inject.fail("mmap", result)
    return result


def create_state(inject: Injector) -> int:
    """The thread table and shadow stacks (zero-filled, private)."""
    return map_far(inject, STATE_SIZE, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS)


def create_ring(inject: Injector, name_address: int, name: str, records: int) -> tuple[int, Ring]:
    """A memfd ring mapped shared in the program and in this process: (address, Ring).

    The name is written at `name_address` (inside a fresh code area) first. The program's
    descriptor is closed again once both sides have mapped the file."""
    inject.world.space.memory.write_code(name_address, name.encode() + b"\0", inject.thread.tid)
    fd = inject.call(SYS_MEMFD_CREATE, name_address, MFD_CLOEXEC | MFD_NOEXEC_SEAL)
    if fd == -_EINVAL:  # before Linux 6.3: no MFD_NOEXEC_SEAL
        fd = inject.call(SYS_MEMFD_CREATE, name_address, MFD_CLOEXEC)
    if fd < 0:
        raise inject.fail("memfd_create (for the event ring)", fd)
    try:
        size = ring_bytes(records)
        result = inject.call(SYS_FTRUNCATE, fd, size)
        if result < 0:
            raise inject.fail("ftruncate (for the event ring)", result)
        ring = Ring.open_from(inject.world.pid, fd, records, name)
        ring.initialize()
        # populated: a stub never takes a page fault on a fresh ring page (~150 ns a record)
        address = map_far(inject, size, PROT_READ_WRITE, MAP_SHARED | MAP_POPULATE, fd)
    finally:
        inject.call(SYS_CLOSE, fd)
    return address, ring


def unmap(inject: Injector, address: int, size: int) -> bool:
    return inject.call(SYS_MUNMAP, address, size) == 0


def new_area(
    start: int, size: int, ring: int, ring_size: int, state: int, owner: Owner, rdebug: int,
    trampoline: int | None,
) -> CodeArea:  # fmt: skip
    return CodeArea(
        start=start,
        size=size,
        ring=ring,
        ring_size=ring_size,
        state=state,
        state_size=STATE_SIZE,
        owner=owner,
        rdebug=rdebug,
        trampoline=trampoline,
    )


def owner_of_this_process(session: int = 0) -> Owner:
    """Our pid and start time (read back by later runs to tell whether we still live)."""
    pid = os.getpid()
    return Owner(pid, pid, process_start_time(pid) or 0, session)


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot): with the pid, names one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def visible_pid(our_pid: int, target: int) -> int:
    """Our pid as `target` would name it for kill(2): ours when we share its pid namespace,
    else 0 (the stubs then skip the liveness check and rely on their timeout)."""
    mine = procfs.status_fields(our_pid).get("NSpid", "").split()
    theirs = procfs.status_fields(target).get("NSpid", "").split()
    return our_pid if len(mine) == len(theirs) else 0
