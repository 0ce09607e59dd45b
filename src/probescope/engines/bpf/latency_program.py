"""Latency in the kernel: each thread's open calls on a stack, paired by stack pointer.

A hash map keyed by thread id holds, per thread, a depth and up to DEPTH slots of (stack
pointer at entry, entry time, function address, the call's key). The rules are those of the
user-space pairing (`aggregate/latency.py`), so both give the same samples:

- an entry first pops the calls its frame has ended — slots whose stack pointer is below its
  own, or equal with the same function (abandoned by longjmp or an exception: counted) — then
  pushes its own; a call deeper than DEPTH is not timed (counted);
- a return expects the slot whose stack pointer is its own minus 8: it pops the slots below
  that (abandoned), then pairs with the top slot if it is that call (same stack pointer and
  function: `bpf_get_func_ip` of a return probe is the function's address), else counts an
  unmatched return;
- the key is built at the entry (probe, task, arguments, user stack) and completed at the
  return (the return value); the duration goes into the key's histogram in the requested
  unit, with the count, sum, min and max in nanoseconds.

Never one slot per (thread, function): recursion would overwrite the outer calls' times.
The pops are unrolled (no loop for the verifier to prove); the slot of the top call is found
at a bounded variable offset.
"""

from __future__ import annotations

from probescope.engines.aggregation import KernelAggregation
from probescope.engines.bpf.abi import BPF_NOEXIST, AttachType, Helper, ProgramType
from probescope.engines.bpf.aggregation_keys import KeyLayout, ValueLayout
from probescope.engines.bpf.aggregation_program import (
    ABANDONED,
    MAP_FULL,
    PID_TGID,
    TEMP_SLOTS,
    TOO_DEEP,
    UNMATCHED,
    AggregationMaps,
    KeyCode,
    emit_bucket_add,
    emit_each_generation,
    emit_enter_generation,
    emit_key,
    emit_leave_generation,
    emit_prologue,
    emit_totals,
    emit_value_pointer,
    key_base,
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
    ld_map_fd,
    ldx,
    mov64_imm,
    mov64_reg,
    st_imm,
    stx,
)
from probescope.engines.bpf.program import KEY_SLOT, ProgramImage, emit_count, emit_return_zero
from probescope.engines.bpf.regs import PtRegs

DEPTH = 64
"""Open calls kept per thread (a power of two: the slot index is masked for the verifier)."""
SLOT_SP, SLOT_TIME, SLOT_FUNCTION, SLOT_KEY = 0, 8, 16, 24

THREAD = Reg.R7  # the thread's value: depth, then the slots
DEPTH_REG = Reg.R8  # its depth while the program works (pid_tgid is spent by then)
SP_SLOT, FUNCTION_SLOT, ABANDONED_SLOT, NOW_SLOT = TEMP_SLOTS


def slot_size(layout: KeyLayout) -> int:
    return SLOT_KEY + ((layout.size + 7) & ~7)


def thread_value_size(layout: KeyLayout) -> int:
    return 8 + DEPTH * slot_size(layout)


def build_entry_program(
    key: KeyCode, maps: AggregationMaps, regs: PtRegs, *, name: str
) -> ProgramImage:
    e = Emitter()
    fc = FetchCompiler(e, regs, is_return=False)
    layout = key.layout
    size = slot_size(layout)
    emit_prologue(e, maps)
    emit_key(e, key, maps, fc, regs, skip=("retval",))
    e.emit(stx(4, Reg.FP, KEY_SLOT, PID_TGID))
    _thread_value(e, maps, create=True, missing="full")
    e.emit(ldx(8, Reg.R1, CTX, regs.offset(regs.stack_pointer)), stx(8, Reg.FP, SP_SLOT, Reg.R1))
    e.emit(ldx(8, Reg.R1, CTX, regs.offset(regs.instruction_pointer)))
    e.emit(stx(8, Reg.FP, FUNCTION_SLOT, Reg.R1))
    e.call(Helper.KTIME_GET_NS)
    e.emit(stx(8, Reg.FP, NOW_SLOT, Reg.R0))
    _load_depth(e)
    # pop the calls this frame has ended
    for _ in range(DEPTH):
        pop = e.fresh("pop")
        e.jump(Jmp.JEQ, DEPTH_REG, 0, "push")
        _top_slot(e, size)
        e.emit(ldx(8, Reg.R2, Reg.R1, 8 + SLOT_SP), ldx(8, Reg.R3, Reg.FP, SP_SLOT))
        e.jump(Jmp.JLT, Reg.R2, Reg.R3, pop)
        e.jump(Jmp.JNE, Reg.R2, Reg.R3, "push")
        e.emit(ldx(8, Reg.R2, Reg.R1, 8 + SLOT_FUNCTION), ldx(8, Reg.R3, Reg.FP, FUNCTION_SLOT))
        e.jump(Jmp.JNE, Reg.R2, Reg.R3, "push")
        e.label(pop)
        _pop_abandoned(e)
    e.label("push")
    e.jump(Jmp.JLT, DEPTH_REG, DEPTH, "room")
    emit_count(e, maps.counters, TOO_DEEP)
    e.goto("store")
    e.label("room")
    e.emit(mov64_reg(Reg.R1, DEPTH_REG), alu64_imm(Alu.AND, Reg.R1, DEPTH - 1))
    e.emit(alu64_imm(Alu.MUL, Reg.R1, size), alu64_reg(Alu.ADD, Reg.R1, THREAD))
    for offset, slot in (
        (SLOT_SP, SP_SLOT),
        (SLOT_TIME, NOW_SLOT),
        (SLOT_FUNCTION, FUNCTION_SLOT),
    ):
        e.emit(ldx(8, Reg.R2, Reg.FP, slot), stx(8, Reg.R1, 8 + offset, Reg.R2))
    base = key_base(layout)
    for offset in range(0, layout.size, 8):
        e.emit(ldx(8, Reg.R2, Reg.FP, base + offset))
        e.emit(stx(8, Reg.R1, 8 + SLOT_KEY + offset, Reg.R2))
    e.emit(alu64_imm(Alu.ADD, DEPTH_REG, 1))
    e.label("store")
    e.emit(stx(8, THREAD, 0, DEPTH_REG))
    _count_abandoned(e, maps)
    e.goto("exit")
    e.label("full")
    emit_count(e, maps.counters, MAP_FULL)
    e.label("exit")
    emit_return_zero(e)
    return _image(e, name)


def build_return_program(
    key: KeyCode,
    aggregation: KernelAggregation,
    values: ValueLayout,
    maps: AggregationMaps,
    regs: PtRegs,
    *,
    name: str,
) -> ProgramImage:
    e = Emitter()
    fc = FetchCompiler(e, regs, is_return=True)
    layout = key.layout
    size = slot_size(layout)
    emit_prologue(e, maps)
    e.emit(stx(4, Reg.FP, KEY_SLOT, PID_TGID))
    _thread_value(e, maps, create=False, missing="unmatched")
    e.emit(ldx(8, Reg.R1, CTX, regs.offset(regs.stack_pointer)), alu64_imm(Alu.SUB, Reg.R1, 8))
    e.emit(stx(8, Reg.FP, SP_SLOT, Reg.R1), mov64_reg(Reg.R1, CTX))
    e.call(Helper.GET_FUNC_IP)
    e.emit(stx(8, Reg.FP, FUNCTION_SLOT, Reg.R0))
    e.call(Helper.KTIME_GET_NS)
    e.emit(stx(8, Reg.FP, NOW_SLOT, Reg.R0))
    _load_depth(e)
    # pop the calls below the returning one (abandoned), then pair with the top
    for _ in range(DEPTH):
        e.jump(Jmp.JEQ, DEPTH_REG, 0, "nomatch")
        _top_slot(e, size)
        e.emit(ldx(8, Reg.R2, Reg.R1, 8 + SLOT_SP), ldx(8, Reg.R3, Reg.FP, SP_SLOT))
        e.jump(Jmp.JGE, Reg.R2, Reg.R3, "top")
        _pop_abandoned(e)
    e.jump(Jmp.JEQ, DEPTH_REG, 0, "nomatch")
    e.label("top")
    _top_slot(e, size)
    e.emit(ldx(8, Reg.R2, Reg.R1, 8 + SLOT_SP), ldx(8, Reg.R3, Reg.FP, SP_SLOT))
    e.jump(Jmp.JNE, Reg.R2, Reg.R3, "nomatch")
    e.emit(ldx(8, Reg.R2, Reg.R1, 8 + SLOT_FUNCTION), ldx(8, Reg.R3, Reg.FP, FUNCTION_SLOT))
    e.jump(Jmp.JNE, Reg.R2, Reg.R3, "nomatch")
    # paired: the key from the slot, the duration from its time
    base = key_base(layout)
    for offset in range(0, layout.size, 8):
        e.emit(ldx(8, Reg.R2, Reg.R1, 8 + SLOT_KEY + offset))
        e.emit(stx(8, Reg.FP, base + offset, Reg.R2))
    e.emit(ldx(8, Reg.R2, Reg.R1, 8 + SLOT_TIME), ldx(8, VALUE, Reg.FP, NOW_SLOT))
    e.emit(alu64_reg(Alu.SUB, VALUE, Reg.R2), stx(8, Reg.FP, NOW_SLOT, VALUE))
    e.emit(alu64_imm(Alu.SUB, DEPTH_REG, 1), stx(8, THREAD, 0, DEPTH_REG))
    _count_abandoned(e, maps)
    retval = layout.part("retval")
    load = key.loads.get("retval")
    if retval is not None and load is not None:
        load.emit(e, fc)
        e.emit(stx(8, Reg.FP, base + retval.offset, VALUE))
    emit_enter_generation(e, maps, "exit")

    def update(map_fd: int) -> None:
        emit_value_pointer(e, map_fd, layout, maps, "full")
        # the bucket is of the duration in the unit; count, sum, min, max in nanoseconds
        e.emit(ldx(8, VALUE, Reg.FP, NOW_SLOT))
        if aggregation.unit_ns > 1:
            e.emit(alu64_imm(Alu.DIV, VALUE, aggregation.unit_ns))
        emit_bucket_add(e, aggregation, signed=False)
        e.emit(ldx(8, VALUE, Reg.FP, NOW_SLOT))
        emit_totals(e, values, signed=False)

    emit_each_generation(e, maps, update, "leave")
    e.label("full")
    emit_count(e, maps.counters, MAP_FULL)
    e.label("leave")
    emit_leave_generation(e, maps)
    e.goto("exit")
    e.label("nomatch")
    e.emit(stx(8, THREAD, 0, DEPTH_REG))
    _count_abandoned(e, maps)
    e.label("unmatched")
    emit_count(e, maps.counters, UNMATCHED)
    e.label("exit")
    emit_return_zero(e)
    return _image(e, name)


def _thread_value(e: Emitter, maps: AggregationMaps, *, create: bool, missing: str) -> None:
    """THREAD = this thread's value (the tid at KEY_SLOT); with `create`, inserted from the
    template when the thread has none."""
    assert maps.threads is not None
    found = e.fresh("thread")

    def lookup() -> None:
        e.emit(ld_map_fd(Reg.R1, maps.threads or 0), mov64_reg(Reg.R2, Reg.FP))
        e.emit(alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
        e.call(Helper.MAP_LOOKUP_ELEM)

    lookup()
    e.jump(Jmp.JNE, Reg.R0, 0, found)
    if not create:
        e.goto(missing)
    else:
        assert maps.thread_template is not None
        e.emit(st_imm(4, Reg.FP, TEMP_SLOTS[0], 0), ld_map_fd(Reg.R1, maps.thread_template))
        e.emit(mov64_reg(Reg.R2, Reg.FP), alu64_imm(Alu.ADD, Reg.R2, TEMP_SLOTS[0]))
        e.call(Helper.MAP_LOOKUP_ELEM)
        e.jump(Jmp.JEQ, Reg.R0, 0, missing)
        e.emit(mov64_reg(Reg.R3, Reg.R0), ld_map_fd(Reg.R1, maps.threads))
        e.emit(mov64_reg(Reg.R2, Reg.FP), alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
        e.emit(mov64_imm(Reg.R4, BPF_NOEXIST))
        e.call(Helper.MAP_UPDATE_ELEM)
        lookup()
        e.jump(Jmp.JEQ, Reg.R0, 0, missing)
    e.label(found)
    e.emit(mov64_reg(THREAD, Reg.R0))


def _load_depth(e: Emitter) -> None:
    """DEPTH_REG = the thread's depth, at most DEPTH; no call abandoned yet."""
    within = e.fresh("depth")
    e.emit(ldx(8, DEPTH_REG, THREAD, 0), st_imm(8, Reg.FP, ABANDONED_SLOT, 0))
    e.jump(Jmp.JLE, DEPTH_REG, DEPTH, within)
    e.emit(mov64_imm(DEPTH_REG, DEPTH))
    e.label(within)


def _top_slot(e: Emitter, size: int) -> None:
    """r1 = the top slot's address (the depth is 1..DEPTH here)."""
    e.emit(mov64_reg(Reg.R1, DEPTH_REG), alu64_imm(Alu.SUB, Reg.R1, 1))
    e.emit(alu64_imm(Alu.AND, Reg.R1, DEPTH - 1), alu64_imm(Alu.MUL, Reg.R1, size))
    e.emit(alu64_reg(Alu.ADD, Reg.R1, THREAD))


def _pop_abandoned(e: Emitter) -> None:
    e.emit(alu64_imm(Alu.SUB, DEPTH_REG, 1), ldx(8, Reg.R2, Reg.FP, ABANDONED_SLOT))
    e.emit(alu64_imm(Alu.ADD, Reg.R2, 1), stx(8, Reg.FP, ABANDONED_SLOT, Reg.R2))


def _count_abandoned(e: Emitter, maps: AggregationMaps) -> None:
    none = e.fresh("none")
    e.emit(ldx(8, Reg.R2, Reg.FP, ABANDONED_SLOT))
    e.jump(Jmp.JEQ, Reg.R2, 0, none)
    e.emit(st_imm(4, Reg.FP, KEY_SLOT, ABANDONED), ld_map_fd(Reg.R1, maps.counters))
    e.emit(mov64_reg(Reg.R2, Reg.FP), alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
    e.call(Helper.MAP_LOOKUP_ELEM)
    e.jump(Jmp.JEQ, Reg.R0, 0, none)
    e.emit(ldx(8, Reg.R2, Reg.FP, ABANDONED_SLOT), atomic_add(8, Reg.R0, 0, Reg.R2))
    e.label(none)


def _image(e: Emitter, name: str) -> ProgramImage:
    return ProgramImage(
        name=name,
        program_type=ProgramType.KPROBE,
        expected_attach_type=AttachType.TRACE_UPROBE_MULTI,
        instructions=e.assemble(),
        functions=tuple(e.functions),
    )
