"""Tracepoint programs: kernel trace events (`t:SYSTEM:EVENT`) recorded through the ring buffer,
and the fork/exit tracker that keeps the pid map of a `-p`/`-c` session following children.

A tracepoint program's context is the event's raw record as the event's `format` file lays it
out (common fields first). The program copies that record whole — `__data_loc` strings
included — behind the usual header, so the values decode with the same rules as the tracefs
engine's, `common_flags` and `common_preempt_count` are the kernel's own, and the `if` filter
is evaluated on the copy. Field offsets come from tracefs's `format` files, read at attach.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from probescope.engines.bpf.abi import AttachType, Helper, ProgramType
from probescope.engines.bpf.fetch import CTX, RECORD
from probescope.engines.bpf.insn import (
    Alu,
    Emitter,
    Jmp,
    Reg,
    alu64_imm,
    alu64_reg,
    ld_map_fd,
    ldx,
    mov64_imm,
    mov64_reg,
    st_imm,
    stx,
)
from probescope.engines.bpf.program import (
    COUNTER_FILTERED,
    KEY_SLOT,
    FilterEmitter,
    ProgramImage,
    SharedMaps,
    emit_claim_scratch,
    emit_count,
    emit_pid_filter,
    emit_return_zero,
    emit_stamped_output,
)
from probescope.engines.bpf.record import (
    COMM_SIZE,
    HEADER_SIZE,
    OFF_COMM,
    OFF_CPU,
    OFF_INDEX,
    OFF_IP,
    OFF_PID_TGID,
    OFF_RET_IP,
)
from probescope.events import EventType
from probescope.language.model import ArgType, ProbeKind
from probescope.traceevent.event_layout import INT_CODES, FieldValue, event_layout
from probescope.traceevent.format import EventFormat

MAX_TRACE_SIZE = 8192
"""PERF_MAX_TRACE_SIZE: no tracepoint record handed to a program is longer."""
_TRACEPOINT_RECORD_AREA = HEADER_SIZE + MAX_TRACE_SIZE


TRACEPOINT_SCRATCH_SIZE = _TRACEPOINT_RECORD_AREA
"""Bytes of scratch a tracepoint program needs: the header and the largest record."""


@dataclass(frozen=True)
class TracepointCode:
    system: str
    event: str
    format: EventFormat
    filter: str | None = None
    emit_filter: FilterEmitter | None = None


def build_tracepoint_program(
    code: TracepointCode,
    maps: SharedMaps,
    scratch_fd: int,
    claim_offset: int,
    *,
    index: int,
    name: str,
    clock: str = "mono",
) -> ProgramImage:
    """Copy each record of the event into the ring buffer (as `index`), after the pid filter
    and the `if` filter."""
    fmt = code.format
    e = Emitter()
    e.emit(mov64_reg(CTX, Reg.R1))
    if maps.pids is not None:
        emit_pid_filter(e, maps.pids, "exit", known=maps.known_pids)
    emit_claim_scratch(e, scratch_fd, claim_offset, "lost")
    _emit_tracepoint_header(e, index)
    # the record's length: its fixed part, or past the end of its last dynamic field
    e.emit(mov64_imm(Reg.R8, fmt.fixed_size))
    for field in fmt.fields:
        if not field.is_dynamic:
            continue
        longer = e.fresh("shorter")
        e.emit(ldx(4, Reg.R1, CTX, field.offset), mov64_reg(Reg.R2, Reg.R1))
        e.emit(alu64_imm(Alu.AND, Reg.R1, 0xFFFF), alu64_imm(Alu.RSH, Reg.R2, 16))
        e.emit(alu64_reg(Alu.ADD, Reg.R1, Reg.R2))
        if field.is_rel_loc:
            e.emit(alu64_imm(Alu.ADD, Reg.R1, field.end))
        e.jump(Jmp.JLE, Reg.R1, Reg.R8, longer)
        e.emit(mov64_reg(Reg.R8, Reg.R1))
        e.label(longer)
    e.jump(Jmp.JGT, Reg.R8, MAX_TRACE_SIZE, "release")
    e.emit(mov64_reg(Reg.R1, RECORD), alu64_imm(Alu.ADD, Reg.R1, HEADER_SIZE))
    e.emit(mov64_reg(Reg.R2, Reg.R8), mov64_reg(Reg.R3, CTX))
    e.call(Helper.PROBE_READ_KERNEL)
    e.jump(Jmp.JNE, Reg.R0, 0, "release")
    e.emit(st_imm(8, RECORD, HEADER_SIZE, 0))  # perf's pt_regs pointer, not common fields
    if code.emit_filter is not None:
        code.emit_filter(e, "filtered")
    e.emit(mov64_reg(Reg.R3, Reg.R8), alu64_imm(Alu.ADD, Reg.R3, HEADER_SIZE))
    e.jump(Jmp.JGT, Reg.R3, _TRACEPOINT_RECORD_AREA, "release")
    emit_stamped_output(e, maps, Reg.R3, clock, "release")
    if e.referenced("filtered"):
        e.label("filtered")
        emit_count(e, maps.counters, COUNTER_FILTERED)
    e.label("release")
    e.emit(st_imm(8, RECORD, claim_offset, 0))
    e.goto("exit")
    e.label("lost")
    emit_count(e, maps.counters)
    e.label("exit")
    emit_return_zero(e)
    instructions = e.assemble()
    return ProgramImage(
        name,
        ProgramType.TRACEPOINT,
        AttachType.NONE,
        instructions,
        functions=tuple(e.functions),
    )


def _emit_tracepoint_header(e: Emitter, index: int) -> None:
    """The header but its timestamp, taken when the record is reserved in the ring."""
    e.emit(st_imm(8, RECORD, OFF_IP, 0), st_imm(8, RECORD, OFF_RET_IP, 0))
    e.call(Helper.GET_CURRENT_PID_TGID)
    e.emit(stx(8, RECORD, OFF_PID_TGID, Reg.R0), st_imm(4, RECORD, OFF_INDEX, index))
    e.call(Helper.GET_SMP_PROCESSOR_ID)
    e.emit(stx(4, RECORD, OFF_CPU, Reg.R0))
    e.emit(mov64_reg(Reg.R1, RECORD), alu64_imm(Alu.ADD, Reg.R1, OFF_COMM))
    e.emit(mov64_imm(Reg.R2, COMM_SIZE))
    e.call(Helper.GET_CURRENT_COMM)


# -- following forks ------------------------------------------------------------------------------


def build_fork_program(fork: EventFormat, pids_fd: int) -> ProgramImage:
    """sched_process_fork: a child of a traced process is traced too (the tracefs engine's
    `event-fork`). The parent is the current task; the child's pid is in the record."""
    child = fork.field("child_pid")
    e = Emitter()
    e.emit(mov64_reg(CTX, Reg.R1))
    emit_pid_filter(e, pids_fd, "exit")
    e.emit(ldx(4, Reg.R1, CTX, child.offset), stx(4, Reg.FP, KEY_SLOT, Reg.R1))
    e.emit(st_imm(8, Reg.FP, KEY_SLOT - 8, 1))
    e.emit(ld_map_fd(Reg.R1, pids_fd), mov64_reg(Reg.R2, Reg.FP))
    e.emit(alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT), mov64_reg(Reg.R3, Reg.FP))
    e.emit(alu64_imm(Alu.ADD, Reg.R3, KEY_SLOT - 8), mov64_imm(Reg.R4, 0))
    e.call(Helper.MAP_UPDATE_ELEM)
    e.label("exit")
    emit_return_zero(e)
    return ProgramImage("ps_fork", ProgramType.TRACEPOINT, AttachType.NONE, e.assemble())


def build_exit_program(exit_format: EventFormat, pids_fd: int) -> ProgramImage:
    """sched_process_exit with group_dead: the process is gone, forget its pid (it may be
    reused by a process nobody asked to trace)."""
    e = Emitter()
    e.emit(mov64_reg(CTX, Reg.R1))
    if exit_format.has_field("group_dead"):
        field = exit_format.field("group_dead")
        e.emit(ldx(1, Reg.R1, CTX, field.offset))
        e.jump(Jmp.JEQ, Reg.R1, 0, "exit")
    e.call(Helper.GET_CURRENT_PID_TGID)
    e.emit(alu64_imm(Alu.RSH, Reg.R0, 32), stx(4, Reg.FP, KEY_SLOT, Reg.R0))
    e.emit(ld_map_fd(Reg.R1, pids_fd), mov64_reg(Reg.R2, Reg.FP))
    e.emit(alu64_imm(Alu.ADD, Reg.R2, KEY_SLOT))
    e.call(Helper.MAP_DELETE_ELEM)
    e.label("exit")
    emit_return_zero(e)
    return ProgramImage("ps_exit", ProgramType.TRACEPOINT, AttachType.NONE, e.assemble())


# -- decoding -------------------------------------------------------------------------------------


def tracepoint_event_type(fmt: EventFormat, system: str) -> tuple[EventType, tuple[Any, ...]]:
    """The EventType of a tracepoint's events and the fields its decoder reads — the trace-event
    layer's own layout of the record (traceevent.event_layout), so both engines type a
    tracepoint's fields by one rule."""
    layout = event_layout(fmt, system, None, ProbeKind.TRACEPOINT, None)
    return layout.event_type, tuple(zip(layout.values, layout.event_type.arg_types, strict=True))


def compile_tracepoint_decoder(
    plan: tuple[Any, ...],
) -> Callable[[bytes, int, int], tuple[Any, ...]]:
    """(span, record start, record length) → the field values, as the tracefs engine gives
    them (strings without their NUL, None for an empty `__data_loc`)."""
    fields: tuple[tuple[FieldValue, ArgType], ...] = plan

    def decode(span: bytes, start: int, length: int) -> tuple[Any, ...]:
        base = start + HEADER_SIZE
        end = start + length
        values: list[Any] = []
        for item, arg_type in fields:
            field = item.field
            at = base + field.offset
            if item.kind == "int" and not item.count:
                values.append(struct.unpack_from(INT_CODES[(item.size, field.signed)], span, at)[0])
            elif item.kind == "int":
                code = INT_CODES[(item.size, field.signed)] * item.count
                values.append(struct.unpack_from("<" + code, span, at))
            elif item.kind == "bytes" and arg_type.is_string:  # char[N]: text up to its NUL
                raw = span[at : at + field.size].split(b"\0", 1)[0]
                values.append(raw.decode("utf-8", "surrogateescape"))
            elif item.kind == "string":
                (word,) = struct.unpack_from("<I", span, at)
                size = word >> 16
                where = base + (word & 0xFFFF) + (field.end if field.is_rel_loc else 0)
                if size and where + size <= end:
                    values.append(span[where : where + size - 1].decode("utf-8", "surrogateescape"))
                else:
                    values.append(None)
            elif field.is_dynamic:
                (word,) = struct.unpack_from("<I", span, at)
                where = base + (word & 0xFFFF) + (field.end if field.is_rel_loc else 0)
                values.append(span[where : where + (word >> 16)])
            else:
                values.append(span[at : at + field.size])
        return tuple(values)

    return decode
