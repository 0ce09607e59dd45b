"""Programs that aggregate at each hit instead of writing a record: build the key on the
stack, find (or insert) its value in a per-CPU hash map, and count — a hit, or a value into
its histogram bucket with count, sum, min and max (see `aggregation_keys` for the layouts).

They start like the record programs (`program.emit_pid_filter`) and read arguments with the
same compiler (`FetchCompiler.load_value`). Counts and sums are atomic adds, min and max
compare-and-exchange: two programs on one CPU can preempt each other even on a per-CPU value.
With intervals, two generations of value maps alternate: a program reads the generation,
marks itself in flight on it (per-CPU counters), writes that generation's map and unmarks; a
reader switches the generation and waits for the old one's programs to finish before it
reads and clears its map, so no hit is lost or counted twice. Latency's entry and return
programs (`latency_program`) use the same key and value code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from probescope.engines.aggregation import KernelAggregation
from probescope.engines.bpf.abi import (
    BPF_F_USER_STACK,
    BPF_NOEXIST,
    AttachType,
    Helper,
    ProgramType,
)
from probescope.engines.bpf.aggregation_keys import (
    COMM_SIZE,
    PID_OFFSET,
    KeyLayout,
    ValueLayout,
)
from probescope.engines.bpf.fetch import CTX, VALUE, FetchCompiler
from probescope.engines.bpf.insn import (
    Alu,
    Emitter,
    Jmp,
    Reg,
    alu64_imm,
    alu64_reg,
    atomic_add,
    atomic_cmpxchg,
    ld_imm64,
    ld_map_fd,
    ldx,
    mov64_imm,
    mov64_reg,
    st_imm,
    stx,
)
from probescope.engines.bpf.program import (
    KEY_SLOT,
    ProgramImage,
    emit_count,
    emit_pid_filter,
    emit_return_zero,
)
from probescope.engines.bpf.regs import PtRegs
from probescope.language.model import FetchArg

GEN_SLOT = -24  # fp-24: the generation this hit writes
TEMP_SLOTS = (-32, -40, -48, -56)  # latency's working words
KEY_END = -56
PID_TGID = Reg.R8  # bpf_get_current_pid_tgid(), kept from the prologue
VALUE_PTR = Reg.R7  # the map value being updated

# counters (a per-CPU array): what could not be counted
MAP_FULL = 0
STACK_LOST = 1
ABANDONED = 2
UNMATCHED = 3
TOO_DEEP = 4
COUNTERS = ("map_full", "stack_lost", "abandoned", "unmatched", "too_deep")

_MIN_ATTEMPTS = 3  # compare-and-exchange retries of min and max (a preempting hit may win)


def key_base(layout: KeyLayout) -> int:
    """The key's place on the stack (fp + this), 8-byte aligned, below the fixed slots."""
    return KEY_END - ((layout.size + 7) & ~7)


@dataclass(frozen=True)
class Loaded:
    """A number one hit reads: a fetch argument of a uprobe (`fetch`), or a field of a
    tracepoint's record at `offset` (`size` bytes)."""

    fetch: FetchArg | None = None
    offset: int = 0
    size: int = 8
    signed: bool = False

    @classmethod
    def of_fetch(cls, arg: FetchArg) -> Loaded:
        return cls(arg, 0, arg.type.size, arg.type.signed)

    def emit(self, e: Emitter, fc: FetchCompiler | None, *, extend: bool = False) -> None:
        """The value in VALUE (r9); 0 where a dereference faults, as the kernel stores a
        faulting argument. `extend`: sign-extend a signed value to 64 bits."""
        if self.fetch is not None:
            assert fc is not None
            fault = e.fresh("vfault")
            done = e.fresh("vdone")
            fc.load_value(self.fetch.fetch, self.fetch.type, fault)
            if e.referenced(fault):
                e.goto(done)
                e.label(fault)
                e.emit(mov64_imm(VALUE, 0))
                e.label(done)
        else:
            e.emit(ldx(self.size, VALUE, CTX, self.offset))
        if extend and self.signed and self.size < 8:
            shift = 64 - 8 * self.size
            e.emit(alu64_imm(Alu.LSH, VALUE, shift), alu64_imm(Alu.ARSH, VALUE, shift))


@dataclass(frozen=True)
class AggregationMaps:
    """The maps an aggregation's programs reference, by fd. `values`: one map, or two
    generations (with `generation` and `inflight`)."""

    values: tuple[int, ...]
    counters: int
    template: int | None = None  # array [0]: a new key's value (histograms, latency)
    pids: int | None = None
    user_stacks: int | None = None
    kernel_stacks: int | None = None
    generation: int | None = None
    inflight: int | None = None
    threads: int | None = None  # latency: each thread's open calls
    thread_template: int | None = None


@dataclass(frozen=True)
class KeyCode:
    """How one program fills the key: `probe_index` None reads the attach cookie; `loads`
    the arguments (and return value) by key field, missing fields stay 0; `return_address`
    adds [sp] after the user stack id (a probe at a function's first byte)."""

    layout: KeyLayout
    loads: dict[str, Loaded] = field(default_factory=dict)
    probe_index: int | None = None
    return_address: bool = False


def emit_prologue(e: Emitter, maps: AggregationMaps) -> None:
    """r6 = context; the pid filter; r8 = pid_tgid."""
    e.emit(mov64_reg(CTX, Reg.R1))
    if maps.pids is not None:
        emit_pid_filter(e, maps.pids, "exit", keep=PID_TGID)
    else:
        e.call(Helper.GET_CURRENT_PID_TGID)
        e.emit(mov64_reg(PID_TGID, Reg.R0))


def emit_key(
    e: Emitter,
    code: KeyCode,
    maps: AggregationMaps,
    fc: FetchCompiler | None,
    regs: PtRegs,
    *,
    skip: tuple[str, ...] = (),
) -> None:
    """Fill the key on the stack (every byte written); `skip` leaves those fields 0."""
    layout = code.layout
    base = key_base(layout)
    for offset in range(0, layout.size, 8):
        e.emit(st_imm(8, Reg.FP, base + offset, 0))
    if code.probe_index is None:
        e.emit(mov64_reg(Reg.R1, CTX))
        e.call(Helper.GET_ATTACH_COOKIE)
        e.emit(stx(4, Reg.FP, base, Reg.R0))
    else:
        e.emit(st_imm(4, Reg.FP, base, code.probe_index))
    if layout.with_pid:
        e.emit(mov64_reg(Reg.R1, PID_TGID), alu64_imm(Alu.RSH, Reg.R1, 32))
        e.emit(stx(4, Reg.FP, base + PID_OFFSET, Reg.R1))
    for part in layout.parts:
        at = base + part.offset
        if part.name in skip:
            continue
        if part.name == "tid":
            e.emit(stx(4, Reg.FP, at, PID_TGID))
        elif part.name == "cpu":
            e.call(Helper.GET_SMP_PROCESSOR_ID)
            e.emit(stx(4, Reg.FP, at, Reg.R0))
        elif part.name == "comm":
            e.emit(mov64_reg(Reg.R1, Reg.FP), alu64_imm(Alu.ADD, Reg.R1, at))
            e.emit(mov64_imm(Reg.R2, COMM_SIZE))
            e.call(Helper.GET_CURRENT_COMM)
        elif part.name in ("ustack", "kstack"):
            stacks = maps.user_stacks if part.name == "ustack" else maps.kernel_stacks
            assert stacks is not None
            flags = BPF_F_USER_STACK if part.name == "ustack" else 0
            stored = e.fresh("stack")
            e.emit(mov64_reg(Reg.R1, CTX), ld_map_fd(Reg.R2, stacks), mov64_imm(Reg.R3, flags))
            e.call(Helper.GET_STACKID)
            e.emit(stx(8, Reg.FP, at, Reg.R0))
            e.jump(Jmp.JSGE, Reg.R0, 0, stored)
            emit_count(e, maps.counters, STACK_LOST)
            e.label(stored)
            if part.name == "ustack" and code.return_address:
                assert fc is not None
                e.emit(ldx(8, Reg.R3, CTX, regs.offset(regs.stack_pointer)))
                fc.read_user_word(Reg.R3, Reg.R1)
                e.emit(stx(8, Reg.FP, at + 8, Reg.R1))
        else:
            load = code.loads.get(part.name)
            if load is not None:
                load.emit(e, fc)
                e.emit(stx(8, Reg.FP, at, VALUE))


# -- generations ------------------------------------------------------------------------------


def emit_enter_generation(e: Emitter, maps: AggregationMaps, leave: str) -> None:
    """GEN_SLOT = the generation to write, marked in flight on this CPU (re-checked after
    marking, so a reader that switched in between is never missed)."""
    if maps.generation is None:
        return
    assert maps.inflight is not None
    _read_generation(e, maps, leave)
    _mark_inflight(e, maps, 1, leave)
    marked = e.fresh("marked")
    e.emit(ldx(8, Reg.R1, Reg.FP, GEN_SLOT), stx(8, Reg.FP, TEMP_SLOTS[0], Reg.R1))
    _read_generation(e, maps, leave)
    e.emit(ldx(8, Reg.R1, Reg.FP, GEN_SLOT), ldx(8, Reg.R2, Reg.FP, TEMP_SLOTS[0]))
    e.jump(Jmp.JEQ, Reg.R1, Reg.R2, marked)
    # switched meanwhile: move the mark to the new generation (kept on the stack: marking
    # calls a helper, which clobbers r1-r5)
    e.emit(stx(8, Reg.FP, TEMP_SLOTS[1], Reg.R1), stx(8, Reg.FP, GEN_SLOT, Reg.R2))
    _mark_inflight(e, maps, -1, leave)
    e.emit(ldx(8, Reg.R1, Reg.FP, TEMP_SLOTS[1]), stx(8, Reg.FP, GEN_SLOT, Reg.R1))
    _mark_inflight(e, maps, 1, leave)
    e.label(marked)


def emit_leave_generation(e: Emitter, maps: AggregationMaps) -> None:
    if maps.generation is None:
        return
    done = e.fresh("left")
    _mark_inflight(e, maps, -1, done)
    e.label(done)


def _read_generation(e: Emitter, maps: AggregationMaps, leave: str) -> None:
    assert maps.generation is not None
    e.emit(st_imm(4, Reg.FP, KEY_SLOT, 0), ld_map_fd(Reg.R1, maps.generation))
    e.emit(mov64_reg(Reg.R2, Reg.FP), alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
    e.call(Helper.MAP_LOOKUP_ELEM)
    e.jump(Jmp.JEQ, Reg.R0, 0, leave)
    e.emit(ldx(8, Reg.R1, Reg.R0, 0), alu64_imm(Alu.AND, Reg.R1, 1))
    e.emit(stx(8, Reg.FP, GEN_SLOT, Reg.R1))


def _mark_inflight(e: Emitter, maps: AggregationMaps, amount: int, missing: str) -> None:
    assert maps.inflight is not None
    e.emit(ldx(8, Reg.R1, Reg.FP, GEN_SLOT), stx(4, Reg.FP, KEY_SLOT, Reg.R1))
    e.emit(ld_map_fd(Reg.R1, maps.inflight), mov64_reg(Reg.R2, Reg.FP))
    e.emit(alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
    e.call(Helper.MAP_LOOKUP_ELEM)
    e.jump(Jmp.JEQ, Reg.R0, 0, missing)
    e.emit(mov64_imm(Reg.R1, amount), atomic_add(8, Reg.R0, 0, Reg.R1))


def emit_each_generation(
    e: Emitter, maps: AggregationMaps, body: Callable[[int], None], after: str
) -> None:
    """`body(map_fd)` for the generation in GEN_SLOT (one copy per generation: the verifier
    wants one map per call site), each copy ending by going to `after`."""
    if len(maps.values) == 1:
        body(maps.values[0])
        e.goto(after)
        return
    second = e.fresh("gen1")
    e.emit(ldx(8, Reg.R1, Reg.FP, GEN_SLOT))
    e.jump(Jmp.JNE, Reg.R1, 0, second)
    body(maps.values[0])
    e.goto(after)
    e.label(second)
    body(maps.values[1])
    e.goto(after)


# -- values -------------------------------------------------------------------------------------


def emit_value_pointer(
    e: Emitter, map_fd: int, layout: KeyLayout, maps: AggregationMaps, full: str
) -> None:
    """VALUE_PTR = this CPU's value of the key on the stack, inserted (from the template, or
    zero) when new; `full` when the map has no room."""
    base = key_base(layout)
    found = e.fresh("found")

    def lookup() -> None:
        e.emit(ld_map_fd(Reg.R1, map_fd), mov64_reg(Reg.R2, Reg.FP))
        e.emit(alu64_imm(Alu.ADD, Reg.R2, base))
        e.call(Helper.MAP_LOOKUP_ELEM)

    lookup()
    e.jump(Jmp.JNE, Reg.R0, 0, found)
    if maps.template is not None:
        e.emit(st_imm(4, Reg.FP, KEY_SLOT, 0), ld_map_fd(Reg.R1, maps.template))
        e.emit(mov64_reg(Reg.R2, Reg.FP), alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
        e.call(Helper.MAP_LOOKUP_ELEM)
        e.jump(Jmp.JEQ, Reg.R0, 0, full)
        e.emit(mov64_reg(Reg.R3, Reg.R0))
    else:
        e.emit(st_imm(8, Reg.FP, TEMP_SLOTS[3], 0), mov64_reg(Reg.R3, Reg.FP))
        e.emit(alu64_imm(Alu.ADD, Reg.R3, TEMP_SLOTS[3]))
    e.emit(ld_map_fd(Reg.R1, map_fd), mov64_reg(Reg.R2, Reg.FP), alu64_imm(Alu.ADD, Reg.R2, base))
    e.emit(mov64_imm(Reg.R4, BPF_NOEXIST))
    e.call(Helper.MAP_UPDATE_ELEM)  # -EEXIST: a preempting hit inserted it first
    lookup()
    e.jump(Jmp.JEQ, Reg.R0, 0, full)
    e.label(found)
    e.emit(mov64_reg(VALUE_PTR, Reg.R0))


def emit_count_hit(e: Emitter) -> None:
    e.emit(mov64_imm(Reg.R1, 1), atomic_add(8, VALUE_PTR, 0, Reg.R1))


def emit_histogram_add(
    e: Emitter, values: ValueLayout, aggregation: KernelAggregation, *, signed: bool
) -> None:
    """Add VALUE (r9) to the histogram at VALUE_PTR: its bucket, count, sum, min, max."""
    emit_bucket_add(e, aggregation, signed=signed)
    emit_totals(e, values, signed=signed)


def emit_bucket_add(e: Emitter, aggregation: KernelAggregation, *, signed: bool) -> None:
    """One more in the bucket of VALUE (r9) of the histogram at VALUE_PTR."""
    emit_bucket_index(e, aggregation, signed=signed)  # r1
    e.emit(alu64_imm(Alu.LSH, Reg.R1, 3), alu64_reg(Alu.ADD, Reg.R1, VALUE_PTR))
    e.emit(mov64_imm(Reg.R2, 1), atomic_add(8, Reg.R1, 0, Reg.R2))


def emit_totals(e: Emitter, values: ValueLayout, *, signed: bool) -> None:
    """Count VALUE (r9) into the count, sum, min and max of the value at VALUE_PTR. Min and
    max are kept as unsigned words that only grow from 0 (`aggregation_keys.extreme_word`):
    a per-CPU map zeroes the other CPUs' values of a key one CPU inserts, so 0 must mean
    "nothing yet" on every CPU."""
    e.emit(mov64_imm(Reg.R2, 1), atomic_add(8, VALUE_PTR, values.count_offset, Reg.R2))
    e.emit(atomic_add(8, VALUE_PTR, values.sum_offset, VALUE))
    for offset, inverted in ((values.min_offset, True), (values.max_offset, False)):
        done = e.fresh("extreme")
        e.emit(mov64_reg(Reg.R4, VALUE))
        if signed:
            e.emit(ld_imm64(Reg.R5, 1 << 63), alu64_reg(Alu.XOR, Reg.R4, Reg.R5))
        if inverted:
            e.emit(alu64_imm(Alu.XOR, Reg.R4, -1))
        e.emit(ldx(8, Reg.R0, VALUE_PTR, offset))
        for _ in range(_MIN_ATTEMPTS):
            e.jump(Jmp.JLE, Reg.R4, Reg.R0, done)
            e.emit(mov64_reg(Reg.R1, Reg.R0), atomic_cmpxchg(8, VALUE_PTR, offset, Reg.R4))
            e.jump(Jmp.JEQ, Reg.R0, Reg.R1, done)
        e.label(done)


def emit_bucket_index(e: Emitter, aggregation: KernelAggregation, *, signed: bool) -> None:
    """r1 = the bucket of VALUE (r9), numbered as `aggregate.values` numbers them, bounded
    for the verifier."""
    done = e.fresh("bucket")
    if aggregation.linear is None:
        if signed:
            e.emit(mov64_imm(Reg.R1, 0))
            e.jump(Jmp.JSLT, VALUE, 0, done)
        e.emit(mov64_imm(Reg.R1, 1))
        e.jump(Jmp.JEQ, VALUE, 0, done)
        # r1 = bit_length(value) + 1, by halving the width six times
        e.emit(mov64_reg(Reg.R2, VALUE), mov64_imm(Reg.R1, 2))
        for shift in (32, 16, 8, 4, 2, 1):
            narrower = e.fresh("narrower")
            e.emit(mov64_reg(Reg.R3, Reg.R2), alu64_imm(Alu.RSH, Reg.R3, shift))
            e.jump(Jmp.JEQ, Reg.R3, 0, narrower)
            e.emit(mov64_reg(Reg.R2, Reg.R3), alu64_imm(Alu.ADD, Reg.R1, shift))
            e.label(narrower)
    else:
        low, high, step = aggregation.linear
        last = (high - low) // step + 1
        less, at_least = (Jmp.JSLT, Jmp.JSGE) if signed or low < 0 else (Jmp.JLT, Jmp.JGE)
        e.emit(mov64_imm(Reg.R1, 0), ld_imm64(Reg.R2, low))
        e.jump(less, VALUE, Reg.R2, done)
        e.emit(mov64_imm(Reg.R1, last), ld_imm64(Reg.R3, high))
        e.jump(at_least, VALUE, Reg.R3, done)
        e.emit(mov64_reg(Reg.R1, VALUE), alu64_reg(Alu.SUB, Reg.R1, Reg.R2))
        e.emit(ld_imm64(Reg.R3, step), alu64_reg(Alu.DIV, Reg.R1, Reg.R3))
        e.emit(alu64_imm(Alu.ADD, Reg.R1, 1))
    e.label(done)
    bounded = e.fresh("bounded")
    e.jump(Jmp.JLE, Reg.R1, aggregation.buckets - 1, bounded)
    e.emit(mov64_imm(Reg.R1, aggregation.buckets - 1))
    e.label(bounded)


# -- whole programs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HitCode:
    """What a count or histogram program computes: its key, and the value a histogram adds
    (`of`, None for counts)."""

    key: KeyCode
    of: Loaded | None = None


def build_hit_program(
    code: HitCode,
    aggregation: KernelAggregation,
    values: ValueLayout,
    maps: AggregationMaps,
    regs: PtRegs,
    *,
    name: str,
    program_type: ProgramType = ProgramType.KPROBE,
    expected_attach_type: AttachType = AttachType.TRACE_UPROBE_MULTI,
    is_return: bool = False,
) -> ProgramImage:
    """Count the hit, or add its `of` value to the histogram, under its key."""
    e = Emitter()
    fc = None
    if program_type is ProgramType.KPROBE:
        fc = FetchCompiler(e, regs, is_return=is_return)
    emit_prologue(e, maps)
    emit_key(e, code.key, maps, fc, regs)
    emit_enter_generation(e, maps, "exit")
    if code.of is not None:
        code.of.emit(e, fc, extend=True)
    signed = code.of.signed if code.of is not None else False

    def update(map_fd: int) -> None:
        emit_value_pointer(e, map_fd, code.key.layout, maps, "full")
        if code.of is None:
            emit_count_hit(e)
        else:
            emit_histogram_add(e, values, aggregation, signed=signed)

    emit_each_generation(e, maps, update, "leave")
    e.label("full")
    emit_count(e, maps.counters, MAP_FULL)
    e.label("leave")
    emit_leave_generation(e, maps)
    e.label("exit")
    emit_return_zero(e)
    return ProgramImage(
        name=name,
        program_type=program_type,
        expected_attach_type=expected_attach_type,
        instructions=e.assemble(),
        functions=tuple(e.functions),
    )
