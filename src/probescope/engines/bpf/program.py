"""Whole uprobe programs: prologue, pid filter, record header, arguments, in-program filter,
and the action that ends a hit — here, a ring-buffer record.

The pieces are separate functions so other actions reuse them: in-kernel aggregation compiles
the same prologue, pid filter and `FetchCompiler.load_value` keys, then updates a map instead
of writing a record (see `RecordAction` for the shape an action takes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from probescope.engines.bpf.abi import BPF_RB_NO_WAKEUP, AttachType, Helper, ProgramType
from probescope.engines.bpf.fetch import CTX, RECORD, FetchCompiler, Unsupported, check_expressible
from probescope.engines.bpf.insn import (
    Alu,
    Emitter,
    Jmp,
    Reg,
    alu64_imm,
    atomic_add,
    atomic_cmpxchg,
    exit_insn,
    ld_map_fd,
    ldx,
    mov64_imm,
    mov64_reg,
    st_imm,
    stx,
)
from probescope.engines.bpf.record import (
    COMM_SIZE,
    OFF_COMM,
    OFF_CPU,
    OFF_INDEX,
    OFF_IP,
    OFF_PID_TGID,
    OFF_RET_IP,
    OFF_TIMESTAMP,
    RecordLayout,
    layout_for,
)
from probescope.engines.bpf.regs import PtRegs
from probescope.engines.bpf.strings import COPIED, ScratchLayout, emit_strings
from probescope.errors import BpfError
from probescope.language.model import (
    Comm,
    Dereference,
    FetchArg,
    FileOffset,
    ImmediateString,
    Memory,
    StackEntry,
    innermost,
)

KEY_SLOT = -16  # fp-16: u32 keys of map lookups
FilterEmitter = Callable[[Emitter, str], None]
"""Emits code that jumps to the given label when the hit is to be dropped (record in r7)."""


@dataclass(frozen=True)
class SharedMaps:
    """The maps every program of a session references (by fd)."""

    ring: int
    counters: int  # per-CPU array: [0] records lost because the ring was full
    pids: int | None = None  # hash u32 tgid -> u8: only these processes (None: all)
    known_pids: tuple[int, ...] = ()  # tgids compared before the map is looked up


@dataclass(frozen=True)
class ProbeCode:
    """What one program computes: its arguments, entry or return, and its filter.

    Probes with equal ProbeCode share one program (and one uprobe_multi link per binary);
    `probe_offset` is set only when an argument needs it (`@+OFFSET`)."""

    args: tuple[FetchArg, ...]
    is_return: bool
    probe_offset: int | None = None
    filter: str | None = None
    emit_filter: FilterEmitter | None = field(default=None, compare=False, hash=False)

    @classmethod
    def of(
        cls,
        args: Sequence[FetchArg],
        is_return: bool,
        offset: int,
        filter_text: str | None = None,
        emit_filter: FilterEmitter | None = None,
    ) -> ProbeCode:
        needs_offset = any(isinstance(innermost(a.fetch), FileOffset) for a in args)
        return cls(
            tuple(args), is_return, offset if needs_offset else None, filter_text, emit_filter
        )

    @property
    def reads_user_memory(self) -> bool:
        """Some argument dereferences, reads the user stack or copies a user string."""
        for arg in self.args:
            first = innermost(arg.fetch)
            if isinstance(arg.fetch, Dereference) or isinstance(
                first, (Memory, FileOffset, StackEntry)
            ):
                return True
            if arg.type.is_string and not isinstance(first, (Comm, ImmediateString)):
                return True
        return False

    def refusal(self) -> str | None:
        """Why these arguments cannot be compiled, or None."""
        for arg in self.args:
            reason = check_expressible(arg.fetch, arg.type, is_return=self.is_return)
            if reason:
                return f"{arg.name}={arg.expression}: {reason}"
        try:
            layout_for(self.args)
        except BpfError as error:
            return error.message
        return None


@dataclass(frozen=True)
class ProgramImage:
    """An assembled program, ready for `prog_load`."""

    name: str
    program_type: ProgramType
    expected_attach_type: AttachType
    instructions: bytes
    layout: RecordLayout | None = None
    scratch: ScratchLayout | None = None
    sleepable: bool = False
    functions: tuple[int, ...] = (0,)  # where each function starts (callbacks after main)

    @property
    def instruction_count(self) -> int:
        return len(self.instructions) // 8


# -- building blocks -----------------------------------------------------------------------------


MAX_KNOWN_PIDS = 8
"""Traced processes named by a comparison each in the program; more go by the map alone."""


def emit_pid_filter(
    e: Emitter,
    pids_fd: int,
    drop: str,
    keep: Reg | None = None,
    known: tuple[int, ...] = (),
) -> None:
    """Go to `drop` unless the current process (tgid) is in the pid map; `keep` is given the
    pid_tgid word (callee-saved register) for the header. The `known` tgids (the command, the
    -p processes) pass on a comparison: only their children pay for the map's lookup."""
    passed = e.fresh("traced")
    e.call(Helper.GET_CURRENT_PID_TGID)
    if keep is not None:
        e.emit(mov64_reg(keep, Reg.R0))
    e.emit(alu64_imm(Alu.RSH, Reg.R0, 32))
    for pid in known[:MAX_KNOWN_PIDS]:
        e.jump(Jmp.JEQ, Reg.R0, pid, passed)
    e.emit(stx(4, Reg.FP, KEY_SLOT, Reg.R0))
    e.emit(
        ld_map_fd(Reg.R1, pids_fd), mov64_reg(Reg.R2, Reg.FP), alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT)
    )
    e.call(Helper.MAP_LOOKUP_ELEM)
    e.jump(Jmp.JEQ, Reg.R0, 0, drop)
    e.label(passed)


CLOCKS = {"mono": Helper.KTIME_GET_NS, "boot": Helper.KTIME_GET_BOOT_NS}
"""The trace clocks a program can read: CLOCK_MONOTONIC and CLOCK_BOOTTIME, in nanoseconds."""


def emit_header(
    e: Emitter,
    regs: PtRegs,
    *,
    is_return: bool,
    index: int | None,
    clock: str | None = "mono",
    pid_tgid: Reg | None = None,
) -> None:
    """Timestamp, addresses, task, probe index, cpu and comm into the record at r7.
    `index` None: the probe index is the attach cookie; `pid_tgid`: a register that already
    holds bpf_get_current_pid_tgid(); `clock` None: no timestamp here (a record built in
    scratch is stamped when it is reserved in the ring, `emit_stamped_output`)."""
    if clock is not None:
        e.call(CLOCKS[clock])
        e.emit(stx(8, RECORD, OFF_TIMESTAMP, Reg.R0))
    ip = ldx(8, Reg.R0, CTX, regs.offset(regs.instruction_pointer))
    if is_return:
        e.emit(mov64_reg(Reg.R1, CTX))
        e.call(Helper.GET_FUNC_IP)
        e.emit(stx(8, RECORD, OFF_IP, Reg.R0), ip, stx(8, RECORD, OFF_RET_IP, Reg.R0))
    else:
        e.emit(ip, stx(8, RECORD, OFF_IP, Reg.R0), st_imm(8, RECORD, OFF_RET_IP, 0))
    if pid_tgid is None:
        e.call(Helper.GET_CURRENT_PID_TGID)
        e.emit(stx(8, RECORD, OFF_PID_TGID, Reg.R0))
    else:
        e.emit(stx(8, RECORD, OFF_PID_TGID, pid_tgid))
    if index is None:
        e.emit(mov64_reg(Reg.R1, CTX))
        e.call(Helper.GET_ATTACH_COOKIE)
        e.emit(stx(4, RECORD, OFF_INDEX, Reg.R0))
    else:
        e.emit(st_imm(4, RECORD, OFF_INDEX, index))
    e.call(Helper.GET_SMP_PROCESSOR_ID)
    e.emit(stx(4, RECORD, OFF_CPU, Reg.R0))
    e.emit(
        mov64_reg(Reg.R1, RECORD),
        alu64_imm(Alu.ADD, Reg.R1, OFF_COMM),
        mov64_imm(Reg.R2, COMM_SIZE),
    )
    e.call(Helper.GET_CURRENT_COMM)


COUNTER_LOST = 0  # records the ring had no room for
COUNTER_FILTERED = 1  # hits the in-program filter dropped


def emit_count(e: Emitter, counters_fd: int, index: int = COUNTER_LOST) -> None:
    """counters[index] += 1, atomically: programs on one CPU can preempt each other."""
    done = e.fresh("counted")
    e.emit(st_imm(4, Reg.FP, KEY_SLOT, index), ld_map_fd(Reg.R1, counters_fd))
    e.emit(mov64_reg(Reg.R2, Reg.FP), alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
    e.call(Helper.MAP_LOOKUP_ELEM)
    e.jump(Jmp.JEQ, Reg.R0, 0, done)
    e.emit(mov64_imm(Reg.R1, 1), atomic_add(8, Reg.R0, 0, Reg.R1))
    e.label(done)


SCRATCH_SLOTS_PER_CPU = 4
"""Scratch values per CPU: a program can be preempted (or sleep on a page fault) while it
builds a record, and another task on the same CPU then needs a scratch value of its own."""


def emit_claim_scratch(e: Emitter, scratch_fd: int, claim_offset: int, none_free: str) -> None:
    """r7 = a scratch value of this CPU claimed with compare-and-exchange on its claim word
    (released by storing 0 there); `none_free` when every slot of this CPU is taken."""
    claimed = e.fresh("claimed")
    e.call(Helper.GET_SMP_PROCESSOR_ID)
    e.emit(alu64_imm(Alu.MUL, Reg.R0, SCRATCH_SLOTS_PER_CPU), stx(4, Reg.FP, KEY_SLOT, Reg.R0))
    for slot in range(SCRATCH_SLOTS_PER_CPU):
        if slot:
            e.emit(ldx(4, Reg.R1, Reg.FP, KEY_SLOT), alu64_imm(Alu.ADD, Reg.R1, 1))
            e.emit(stx(4, Reg.FP, KEY_SLOT, Reg.R1))
        e.emit(ld_map_fd(Reg.R1, scratch_fd), mov64_reg(Reg.R2, Reg.FP))
        e.emit(alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
        e.call(Helper.MAP_LOOKUP_ELEM)
        e.jump(Jmp.JEQ, Reg.R0, 0, none_free)
        e.emit(mov64_reg(RECORD, Reg.R0), mov64_imm(Reg.R0, 0), mov64_imm(Reg.R1, 1))
        e.emit(atomic_cmpxchg(8, RECORD, claim_offset, Reg.R1))
        e.jump(Jmp.JEQ, Reg.R0, 0, claimed)
    e.goto(none_free)
    e.label(claimed)


DYNPTR_SLOT = -80  # fp-80..fp-65: the ring-buffer dynptr of a record built in scratch
STAMP_SIZE = Reg.R9  # callee-saved: the record's size across the helpers of the output


def emit_stamped_output(e: Emitter, maps: SharedMaps, size: Reg, clock: str, done: str) -> None:
    """Copy the record built at r7 (`size` bytes, bounded for the verifier) into the ring,
    reading the clock only once its place is reserved, then go to `done` (a failed
    reservation is counted lost).

    Every record is stamped after its reservation, so a record reserved later than another
    never carries an earlier time than the moment the other was reserved: what lets the
    reader release events in exact time order (see ring_spool.py). `bpf_ringbuf_output`
    reserves and copies in one call, too late to stamp; a dynptr reservation leaves room to."""
    failed = e.fresh("unreserved")
    if size != STAMP_SIZE:
        e.emit(mov64_reg(STAMP_SIZE, size))
    e.emit(ld_map_fd(Reg.R1, maps.ring), mov64_reg(Reg.R2, STAMP_SIZE), mov64_imm(Reg.R3, 0))
    e.emit(mov64_reg(Reg.R4, Reg.FP), alu64_imm(Alu.ADD, Reg.R4, DYNPTR_SLOT))
    e.call(Helper.RINGBUF_RESERVE_DYNPTR)
    e.jump(Jmp.JNE, Reg.R0, 0, failed)
    e.call(CLOCKS[clock])
    e.emit(stx(8, RECORD, OFF_TIMESTAMP, Reg.R0))
    e.emit(mov64_reg(Reg.R1, Reg.FP), alu64_imm(Alu.ADD, Reg.R1, DYNPTR_SLOT), mov64_imm(Reg.R2, 0))
    e.emit(mov64_reg(Reg.R3, RECORD), mov64_reg(Reg.R4, STAMP_SIZE), mov64_imm(Reg.R5, 0))
    e.call(Helper.DYNPTR_WRITE)
    e.emit(mov64_reg(Reg.R1, Reg.FP), alu64_imm(Alu.ADD, Reg.R1, DYNPTR_SLOT))
    e.emit(mov64_imm(Reg.R2, BPF_RB_NO_WAKEUP))
    e.call(Helper.RINGBUF_SUBMIT_DYNPTR)
    e.goto(done)
    e.label(failed)  # the verifier wants even a failed reservation's dynptr released
    e.emit(mov64_reg(Reg.R1, Reg.FP), alu64_imm(Alu.ADD, Reg.R1, DYNPTR_SLOT), mov64_imm(Reg.R2, 0))
    e.call(Helper.RINGBUF_DISCARD_DYNPTR)
    emit_count(e, maps.counters)
    e.goto(done)


def emit_return_zero(e: Emitter) -> None:
    e.emit(mov64_imm(Reg.R0, 0), exit_insn())


# -- the record action ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordAction:
    """Each hit becomes one ring-buffer record. Without strings the record is reserved in the
    ring at its fixed size and written in place; with strings it is built in a scratch value
    (an array of SCRATCH_SLOTS_PER_CPU values per CPU, `ScratchLayout.value_size` + 8 bytes
    each, shared by every program of the session: the claim word is at one offset past the
    largest layout) and copied out at its real length
    (`bpf_ringbuf_output`). Both submit with BPF_RB_NO_WAKEUP: the reader drains in batches."""

    maps: SharedMaps
    scratch_fd: int | None = None
    claim_offset: int = 0  # where the claim word of every scratch value is


def build_record_program(
    code: ProbeCode,
    action: RecordAction,
    regs: PtRegs,
    *,
    name: str,
    index: int | None = None,
    sleepable: bool = False,
    expected_attach_type: AttachType = AttachType.TRACE_UPROBE_MULTI,
    clock: str = "mono",
) -> ProgramImage:
    """The program for every probe whose code is `code`. `index` is the probe index when the
    program serves a single probe; None reads it from the attach cookie. `sleepable` lets the
    program fault user pages in (uprobe_multi links only); it is used only where the code
    reads user memory."""
    refusal = code.refusal()
    if refusal:
        raise Unsupported(refusal)
    layout = layout_for(code.args)
    sleepable = sleepable and code.reads_user_memory
    e = Emitter()
    e.emit(mov64_reg(CTX, Reg.R1))
    maps = action.maps
    pid_tgid = None
    if maps.pids is not None:
        pid_tgid = Reg.R8  # free until the strings, which come after the header
        emit_pid_filter(e, maps.pids, "exit", keep=pid_tgid, known=maps.known_pids)
    fc = FetchCompiler(
        e, regs, is_return=code.is_return, probe_offset=code.probe_offset, sleepable=sleepable
    )
    scratch = ScratchLayout.plan(layout) if layout.has_strings else None
    if scratch is None:
        e.emit(ld_map_fd(Reg.R1, maps.ring), mov64_imm(Reg.R2, layout.size), mov64_imm(Reg.R3, 0))
        e.call(Helper.RINGBUF_RESERVE)
        e.jump(Jmp.JEQ, Reg.R0, 0, "lost")
        e.emit(mov64_reg(RECORD, Reg.R0))
    else:
        if action.scratch_fd is None or action.claim_offset < scratch.value_size:
            raise Unsupported("a program with strings needs a scratch map large enough")
        emit_claim_scratch(e, action.scratch_fd, action.claim_offset, "lost")
    emit_header(
        e,
        regs,
        is_return=code.is_return,
        index=index,
        clock=clock if scratch is None else None,
        pid_tgid=pid_tgid,
    )
    for slot in layout.slots:
        if not slot.is_string:
            fc.store_number(slot)
    if scratch is not None:
        emit_strings(fc, scratch)
    if code.emit_filter is not None:
        code.emit_filter(e, "drop")
    if scratch is None:
        e.emit(mov64_reg(Reg.R1, RECORD), mov64_imm(Reg.R2, BPF_RB_NO_WAKEUP))
        e.call(Helper.RINGBUF_SUBMIT)
        e.goto("exit")
        if e.referenced("drop"):
            e.label("drop")
            emit_count(e, maps.counters, COUNTER_FILTERED)
            e.emit(mov64_reg(Reg.R1, RECORD), mov64_imm(Reg.R2, BPF_RB_NO_WAKEUP))
            e.call(Helper.RINGBUF_DISCARD)
            e.goto("exit")
        e.label("lost")
        emit_count(e, maps.counters)
    else:
        # size = fixed part + string bytes, bounded for the verifier
        e.emit(mov64_reg(Reg.R3, COPIED), alu64_imm(Alu.ADD, Reg.R3, layout.strings_offset))
        e.jump(Jmp.JGT, Reg.R3, scratch.record_area, "release")
        emit_stamped_output(e, maps, Reg.R3, clock, "release")
        if e.referenced("drop"):
            e.label("drop")
            emit_count(e, maps.counters, COUNTER_FILTERED)
        e.label("release")
        e.emit(st_imm(8, RECORD, action.claim_offset, 0))
        e.goto("exit")
        e.label("lost")
        emit_count(e, maps.counters)
    e.label("exit")
    emit_return_zero(e)
    return ProgramImage(
        name=name,
        program_type=ProgramType.KPROBE,
        expected_attach_type=expected_attach_type,
        instructions=e.assemble(),
        layout=layout,
        scratch=scratch,
        sleepable=sleepable,
        functions=tuple(e.functions),
    )
