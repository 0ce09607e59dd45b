"""String arguments with the kernel's length rules, compiled into a record built in a per-CPU
scratch value (trace_probe_tmpl.h `__get_data_size` then `store_trace_args`):

1. measure: each string's length with its NUL, read up to MAX_STRING_SIZE; a longer one, or
   one that faults, counts 0;
2. the total is clamped so the hit's arguments fit one page (MAX_UCB_BUFFER_SIZE);
3. copy in definition order, each with what is left as its maximum: a longer string is cut
   to that many bytes (its last one the NUL), nothing left or a fault stores length 0, the
   kernel's `(fault)`.

A Go string (`GoString`) is measured as its length plus the NUL (a length above
MAX_STRING_SIZE - 1 is cut to it, a negative one is a fault) and copied with
bpf_probe_read_user of exactly that many bytes (no NUL is looked for: a Go string has none), then
a NUL; an empty one is stored without a read, an unreadable one is a fault.
`$comm` is measured and copied from the comm in the record header; an immediate string
(`\\"TEXT"`) is a fault, as the kernel's copy from user space of a kernel pointer is.
Registers: r8 holds the total, then what is left; r9 the bytes copied so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from probescope.engines.bpf.abi import Helper
from probescope.engines.bpf.fetch import RECORD, FetchCompiler, FetchProgram
from probescope.engines.bpf.insn import (
    Alu,
    Jmp,
    Reg,
    alu64_imm,
    alu64_reg,
    ldx,
    mov64_imm,
    mov64_reg,
    st_imm,
    stx,
)
from probescope.engines.bpf.record import (
    COMM_SIZE,
    MAX_STRING_SIZE,
    OFF_COMM,
    PAGE_SIZE,
    RecordLayout,
)
from probescope.language.model import Comm, GoString, ImmediateString

TOTAL = Reg.R8
LEFT = Reg.R8
COPIED = Reg.R9


class SourceKind(Enum):
    USER = "user"
    GO = "go"  # a Go string: its pointer in the address slot, its length in the next word
    COMM = "comm"
    FAULT = "fault"


@dataclass(frozen=True)
class StringSource:
    kind: SourceKind
    word: int  # record offset of its `__data_loc` word
    address_slot: int = -1  # scratch offset of its user address (USER and GO)


@dataclass(frozen=True)
class ScratchLayout:
    """The per-CPU scratch value of a program with strings: the record (with room for the
    worst case the verifier must allow), a buffer to measure strings in, the source table."""

    record: RecordLayout
    sources: tuple[StringSource, ...]

    @property
    def record_area(self) -> int:
        return _round8(self.record.strings_offset + 2 * self.record.string_budget)

    @property
    def measure_buffer(self) -> int:
        return self.record_area

    @property
    def address_table(self) -> int:
        return _round8(self.measure_buffer + MAX_STRING_SIZE + 1)

    @property
    def value_size(self) -> int:
        words = sum(2 if s.kind is SourceKind.GO else 1 for s in self.sources)
        return self.address_table + 8 * max(1, words)

    @classmethod
    def plan(cls, record: RecordLayout) -> ScratchLayout:
        sources: list[StringSource] = []
        user = 0
        for slot in record.slots:
            if not slot.is_string:
                continue
            first = FetchProgram.of(slot.arg.fetch).first
            for element in range(slot.elements):
                word = slot.offset + 4 * element
                if isinstance(first, Comm):
                    sources.append(StringSource(SourceKind.COMM, word))
                elif isinstance(first, ImmediateString):
                    sources.append(StringSource(SourceKind.FAULT, word))
                elif isinstance(first, GoString):
                    sources.append(StringSource(SourceKind.GO, word, user))
                    user += 2
                else:
                    sources.append(StringSource(SourceKind.USER, word, user))
                    user += 1
        # user addresses are numbered first, their slots placed once the table start is known
        layout = cls(record, tuple(sources))
        table = layout.address_table
        placed = tuple(
            StringSource(s.kind, s.word, table + 8 * s.address_slot)
            if s.kind in (SourceKind.USER, SourceKind.GO)
            else s
            for s in sources
        )
        return cls(record, placed)


EFAULT = 14


def _round8(size: int) -> int:
    return (size + 7) & ~7


def _read_user_string(
    fc: FetchCompiler, setup: Callable[[], None], address_slot: int, page_size: int
) -> None:
    """`setup()` loads r1 (destination) and r2 (size); then r0 = probe_read_user_str(r1, r2,
    the address in the scratch slot). In a sleepable program a fault is retried once after
    faulting in the string's page and the next (a string may cross into it) with
    bpf_copy_from_user of one byte each, as the kernel's own strnlen_user would."""
    e = fc.e
    setup()
    e.emit(ldx(8, Reg.R3, RECORD, address_slot))
    e.call(Helper.PROBE_READ_USER_STR)
    if not fc.sleepable:
        return
    done = e.fresh("read")
    e.jump(Jmp.JNE, Reg.R0, -EFAULT, done)
    for next_page in (False, True):
        e.emit(ldx(8, Reg.R3, RECORD, address_slot))
        if next_page:
            e.emit(alu64_imm(Alu.OR, Reg.R3, page_size - 1), alu64_imm(Alu.ADD, Reg.R3, 1))
        e.emit(mov64_reg(Reg.R1, Reg.FP), alu64_imm(Alu.ADD, Reg.R1, -8), mov64_imm(Reg.R2, 1))
        e.call(Helper.COPY_FROM_USER)
    setup()
    e.emit(ldx(8, Reg.R3, RECORD, address_slot))
    e.call(Helper.PROBE_READ_USER_STR)
    e.label(done)


def emit_strings(fc: FetchCompiler, scratch: ScratchLayout) -> None:
    """Fetch, measure and copy every string argument; leaves r9 = the string bytes stored."""
    e = fc.e
    record = scratch.record
    # 0. where each string comes from
    for slot in record.slots:
        if not slot.is_string:
            continue
        first = FetchProgram.of(slot.arg.fetch).first
        if isinstance(first, (Comm, ImmediateString)):
            continue
        owned = [s for s in scratch.sources if slot.offset <= s.word < slot.offset + slot.size]
        fc.string_sources(slot, owned[0].address_slot)
    # 1. measure
    e.emit(mov64_imm(TOTAL, 0))
    for source in scratch.sources:
        if source.kind is SourceKind.FAULT:
            continue
        skip = e.fresh("measured")
        if source.kind is SourceKind.COMM:
            e.emit(mov64_reg(Reg.R1, RECORD), alu64_imm(Alu.ADD, Reg.R1, scratch.measure_buffer))
            e.emit(mov64_imm(Reg.R2, COMM_SIZE), mov64_reg(Reg.R3, RECORD))
            e.emit(alu64_imm(Alu.ADD, Reg.R3, OFF_COMM))
            e.call(Helper.PROBE_READ_KERNEL_STR)
        elif source.kind is SourceKind.GO:
            # its length, cut to MAX_STRING_SIZE with the NUL; a negative one is no string
            _go_string_bytes(fc, source, skip)
            e.emit(alu64_imm(Alu.ADD, Reg.R0, 1))
        else:

            def measure_into() -> None:
                e.emit(mov64_reg(Reg.R1, RECORD))
                e.emit(alu64_imm(Alu.ADD, Reg.R1, scratch.measure_buffer))
                e.emit(mov64_imm(Reg.R2, MAX_STRING_SIZE + 1))

            _read_user_string(fc, measure_into, source.address_slot, PAGE_SIZE)
        e.jump(Jmp.JSLE, Reg.R0, 0, skip)
        e.jump(Jmp.JGT, Reg.R0, MAX_STRING_SIZE, skip)
        e.emit(alu64_reg(Alu.ADD, TOTAL, Reg.R0))
        e.label(skip)
    # 2. clamp to the page
    budget = record.string_budget
    clamped = e.fresh("clamped")
    e.jump(Jmp.JLE, TOTAL, budget, clamped)
    e.emit(mov64_imm(TOTAL, budget))
    e.label(clamped)
    # 3. copy
    e.emit(mov64_imm(COPIED, 0))
    for source in scratch.sources:
        fault = e.fresh("strfault")
        done = e.fresh("strdone")
        if source.kind is SourceKind.FAULT:
            e.goto(fault)
        else:
            e.jump(Jmp.JEQ, LEFT, 0, fault)

            def copy_into(fault: str = fault) -> None:
                # bounds the verifier needs (never taken: what is left and what was copied
                # add up to at most the budget)
                e.jump(Jmp.JGT, LEFT, budget, fault)
                e.jump(Jmp.JGT, COPIED, budget, fault)
                e.emit(mov64_reg(Reg.R1, RECORD), alu64_reg(Alu.ADD, Reg.R1, COPIED))
                e.emit(alu64_imm(Alu.ADD, Reg.R1, record.strings_offset), mov64_reg(Reg.R2, LEFT))

            if source.kind is SourceKind.COMM:
                copy_into()
                e.emit(mov64_reg(Reg.R3, RECORD), alu64_imm(Alu.ADD, Reg.R3, OFF_COMM))
                e.call(Helper.PROBE_READ_KERNEL_STR)
            elif source.kind is SourceKind.GO:
                _copy_go_string(fc, source, copy_into, budget, record.strings_offset, fault)
            else:
                _read_user_string(fc, copy_into, source.address_slot, PAGE_SIZE)
            e.jump(Jmp.JSLE, Reg.R0, 0, fault)
            # word = length << 16 | offset from the record start
            e.emit(mov64_reg(Reg.R1, Reg.R0), alu64_imm(Alu.LSH, Reg.R1, 16))
            e.emit(mov64_reg(Reg.R2, COPIED), alu64_imm(Alu.ADD, Reg.R2, record.strings_offset))
            e.emit(alu64_reg(Alu.OR, Reg.R1, Reg.R2), stx(4, RECORD, source.word, Reg.R1))
            e.emit(alu64_reg(Alu.ADD, COPIED, Reg.R0), alu64_reg(Alu.SUB, LEFT, Reg.R0))
            e.goto(done)
        e.label(fault)
        e.emit(mov64_reg(Reg.R1, COPIED), alu64_imm(Alu.ADD, Reg.R1, record.strings_offset))
        e.emit(stx(4, RECORD, source.word, Reg.R1))
        e.label(done)


def _go_string_bytes(fc: FetchCompiler, source: StringSource, negative: str) -> None:
    """r0 = the Go string's length, at most MAX_STRING_SIZE - 1 (room for the NUL); a
    negative length jumps to `negative`."""
    e = fc.e
    short = e.fresh("goshort")
    e.emit(ldx(8, Reg.R0, RECORD, source.address_slot + 8))
    e.jump(Jmp.JSLT, Reg.R0, 0, negative)
    e.jump(Jmp.JLE, Reg.R0, MAX_STRING_SIZE - 1, short)
    e.emit(mov64_imm(Reg.R0, MAX_STRING_SIZE - 1))
    e.label(short)


def _copy_go_string(
    fc: FetchCompiler,
    source: StringSource,
    copy_into: Callable[[], None],
    budget: int,
    strings_offset: int,
    fault: str,
) -> None:
    """Copy exactly the Go string's bytes (bpf_probe_read_user of its length, cut to what is
    left less one) and a NUL after them; leaves r0 = the bytes stored, NUL included. Its
    length slot holds the byte count across the helper call (r6-r9 are all taken)."""
    e = fc.e
    count = source.address_slot + 8
    fits = e.fresh("gofits")
    empty = e.fresh("goempty")
    _go_string_bytes(fc, source, fault)
    e.jump(Jmp.JLT, Reg.R0, LEFT, fits)
    e.emit(mov64_reg(Reg.R0, LEFT), alu64_imm(Alu.SUB, Reg.R0, 1))
    e.label(fits)
    e.jump(Jmp.JGT, Reg.R0, budget, fault)  # for the verifier (never taken)
    e.emit(stx(8, RECORD, count, Reg.R0))
    copy_into()
    e.emit(ldx(8, Reg.R2, RECORD, count))
    e.jump(Jmp.JGT, Reg.R2, budget, fault)
    e.jump(Jmp.JEQ, Reg.R2, 0, empty)  # "" (Go's may have a nil pointer): nothing to read
    e.emit(ldx(8, Reg.R3, RECORD, source.address_slot))
    e.call(fc.read_user)
    e.jump(Jmp.JNE, Reg.R0, 0, fault)
    e.label(empty)
    e.emit(ldx(8, Reg.R0, RECORD, count))
    e.jump(Jmp.JGT, Reg.R0, budget, fault)
    e.emit(mov64_reg(Reg.R1, RECORD), alu64_reg(Alu.ADD, Reg.R1, COPIED))
    e.emit(alu64_reg(Alu.ADD, Reg.R1, Reg.R0), st_imm(1, Reg.R1, strings_offset, 0))
    e.emit(alu64_imm(Alu.ADD, Reg.R0, 1))
