"""The engine's picture of what it traces: probe sites, breakpoints, address spaces, threads.

An AddressSpace is one mm (a process; a vfork child borrows its parent's until exec). It owns
the breakpoints, the XOL areas and the trampoline. A Thread owns its registers buffer, its
shadow stack of hijacked returns and whatever is in flight for it (a single-step, an injected
syscall, a signal to pass on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import syscalls
from probescope.engines.ptrace.fetch import ProbeFetcher
from probescope.engines.ptrace.insn_x86_64 import ProbedInstruction, StepPlan
from probescope.engines.ptrace.memory import TraceeMemory
from probescope.events import EventType
from probescope.language.resolved import ResolvedProbe
from probescope.system import procfs
from probescope.system.maps import Mapping, read_maps

Handler = Callable[[Any], None]


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


@dataclass(eq=False)
class ProbeSite:
    """One resolved probe with everything a hit needs, shared by all processes."""

    probe: ResolvedProbe
    event_type: EventType
    fetcher: ProbeFetcher
    key: str  # "group/event"
    file_key: tuple[int, int]  # (device, inode) of the probed file, as maps shows it
    offset: int
    is_return: bool
    handlers: list[Handler] = field(default_factory=list)


@dataclass(eq=False)
class Breakpoint:
    """An int3 at one address of one address space and how its instruction runs displaced."""

    address: int
    file_offset: int
    instruction: ProbedInstruction
    entry_sites: list[ProbeSite] = field(default_factory=list)
    return_sites: list[ProbeSite] = field(default_factory=list)
    slot: int | None = None
    step_slot: int | None = None
    step_plan: StepPlan | None = None
    single_step: bool = False
    internal: str | None = None  # "rendezvous" for the dynamic linker's r_brk
    mapping_key: tuple[int, int] = (0, 0)

    @property
    def ambiguous(self) -> bool:
        """A one-byte instruction: ip == address+1 may also be a plain instruction boundary,
        so a trap there must be confirmed with si_code."""
        return self.instruction.length == arch.BREAKPOINT_SIZE

    @property
    def probe_base(self) -> int:
        return self.address - self.file_offset


@dataclass
class ReturnInstance:
    """The kernel's return_instance: one hijacked return address."""

    stack: int  # sp at the entry hit: where the return address lives
    original: int  # the caller's return address we replaced
    breakpoint: Breakpoint
    chained: bool
    entry_ns: int
    exposed: bool = False  # original put back while an exception unwinds


@dataclass
class StepInFlight:
    """A thread single-stepping a copy of a probed instruction (the fallback path)."""

    breakpoint: Breakpoint
    slot: int
    saved_scratch: int | None


class AddressSpace:
    """One traced mm: its breakpoints, XOL areas and trampoline."""

    def __init__(self, tgid: int) -> None:
        self.tgid = tgid
        self.memory = TraceeMemory(tgid)
        self.breakpoints: dict[int, Breakpoint] = {}
        self.xol_areas: list[tuple[int, int]] = []  # (start, size)
        self.xol_used: dict[int, int] = {}  # area start -> bytes used
        self.trampoline: int | None = None
        self.applied: set[tuple[int, tuple[int, int, int], int]] = set()
        self.rendezvous: Any = None
        self.last_scan = 0.0
        self.return_refusal: str | None = None
        self.unwinder_checked: set[tuple[int, int]] = set()
        self.semaphores: dict[int, int] = {}  # USDT semaphore address -> our increments
        self.shared_with: AddressSpace | None = None  # vfork child: parent's mm
        self.threads: set[int] = set()
        self.closed = False

    def in_xol(self, address: int) -> bool:
        return any(start <= address < start + size for start, size in self.xol_areas)

    def slot_owner(self, address: int) -> Breakpoint | None:
        """The breakpoint whose slot (or step slot) starts at `address`."""
        for bp in self.breakpoints.values():
            if bp.slot == address or bp.step_slot == address:
                return bp
        return None

    def mappings(self) -> list[Mapping]:
        """The address space's maps now (ProcessError when the process is gone)."""
        return read_maps(self.tgid)


class Thread:
    """One traced thread."""

    __slots__ = (
        "awaiting_first_stop", "comm", "comm_time", "group_stop", "injection_regs",
        "pending_signal", "process", "regs", "regset", "running", "saved_affinity",
        "shadow", "shstk_checked", "silent", "step", "stop_status", "tgid", "tid",
    )  # fmt: skip

    def __init__(self, tid: int, process: AddressSpace, tgid: int | None = None) -> None:
        self.tid = tid
        self.tgid = process.tgid if tgid is None else tgid
        self.process = process
        self.regs = arch.Registers()
        self.regset = syscalls.RegisterSet(self.regs)
        self.running = False
        self.shadow: list[ReturnInstance] = []
        self.step: StepInFlight | None = None
        self.injection_regs: arch.Registers | None = None
        self.pending_signal = 0
        self.group_stop = False
        self.comm = ""
        self.comm_time = 0.0
        self.silent = False
        self.saved_affinity: set[int] | None = None
        self.awaiting_first_stop = False
        self.stop_status = 0
        self.shstk_checked = False

    def current_comm(self, max_age: float = 0.1) -> str:
        """comm from /proc/TID/comm, re-read when older than `max_age` seconds (so a
        prctl(PR_SET_NAME) shows up within that time)."""
        now = time.monotonic()
        if now - self.comm_time > max_age:
            self.comm = procfs.read_comm(self.tid)
            self.comm_time = now
        return self.comm

    def forget_comm(self) -> None:
        self.comm_time = 0.0
