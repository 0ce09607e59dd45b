"""Filter expressions compiled into a program, evaluated on the record the program just built
(r7), so that filtered-out hits never reach user space. The comparisons follow the kernel's
(`filter_pred_*` and `regex_match_*` in kernel/trace/trace_events_filter.c):

- numbers compare in the field's own type: the value is cast to the field's size and
  signedness first (`u8 x == 300` tests 44), `&` tests that any of the bits is set;
- strings: `==`/`!=` compare like strncmp over the field's length (a `__data_loc` string's
  length includes its NUL; `comm` and `char[N]` arrays use N); `~ "abc*"` matches the front,
  `~ "*abc"` the end (of length − 1 bytes, as the kernel counts), `~ "*abc*"` anywhere (one
  position per call of a `bpf_loop` callback); a leading `!` in the pattern negates. Full
  globs (`a*c`, `?`, `[...]`) are refused: the kernel's glob_match backtracks, which a
  verifier-checked program cannot.

Only r0-r5 (and fp-64..fp-33 for a search) are used: r8 and r9 still hold what the program
needs after the filter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from probescope.engines.bpf.abi import Helper
from probescope.engines.bpf.fetch import RECORD
from probescope.engines.bpf.insn import (
    Alu,
    Emitter,
    Jmp,
    Reg,
    alu64_imm,
    alu64_reg,
    exit_insn,
    ld_imm64,
    ldx,
    mov64_imm,
    mov64_reg,
    st_imm,
    stx,
)
from probescope.errors import SpecError, SpecErrors
from probescope.language.event_filter import (
    And,
    Expression,
    Not,
    Or,
    Predicate,
    check_string_operator,
    fields_of,
    glob_kind,
    number_operand,
)

MAX_MIDDLE_PATTERN = 64
"""Longest `*text*` pattern compiled (its loop is checked once per position by the verifier)."""
MAX_STRING = 4096


@dataclass(frozen=True)
class NumberField:
    """An integer at record offset `offset`."""

    offset: int
    size: int
    signed: bool


@dataclass(frozen=True)
class FixedString:
    """A char array at record offset `offset` of `size` bytes (`comm`, `char name[N]`)."""

    offset: int
    size: int


@dataclass(frozen=True)
class LocatedString:
    """A string whose `len << 16 | offset` word is at record offset `word`; offsets count from
    record offset `base` (plus the word's own end for `__rel_loc`). `area`: bytes of the record
    buffer the program may read."""

    word: int
    base: int
    area: int


FieldPlace = NumberField | FixedString | LocatedString
FieldResolver = Callable[[str], FieldPlace | None]


@dataclass(frozen=True)
class PredicatePlan:
    """A predicate checked against its field: what to emit."""

    place: FieldPlace
    op: str
    number: int = 0
    pattern: bytes = b""
    match: str = "full"  # full, front, end, middle
    negate: bool = False


def plan_filter(
    tree: Expression, resolve: FieldResolver, *, spec: str, column: int, fields_hint: str
) -> dict[Predicate, PredicatePlan]:
    """Check every predicate (all problems collected) and decide how each is evaluated."""
    plans: dict[Predicate, PredicatePlan] = {}
    errors: list[SpecError] = []
    for predicate in fields_of(tree):
        try:
            plans[predicate] = _plan(predicate, resolve, spec, column, fields_hint)
        except SpecError as error:
            errors.append(error)
    if errors:
        raise errors[0] if len(errors) == 1 else SpecErrors(errors)
    return plans


def _plan(
    predicate: Predicate, resolve: FieldResolver, spec: str, column: int, fields_hint: str
) -> PredicatePlan:
    def error(message: str, at: int, hint: str | None = None) -> SpecError:
        return SpecError(message, spec=spec, column=column + at, hint=hint)

    place = resolve(predicate.field)
    if place is None:
        raise error(f"no field {predicate.field!r} to filter on", predicate.column, fields_hint)
    if isinstance(place, NumberField):
        value = number_operand(predicate, place.size, place.signed, error)
        return PredicatePlan(place, predicate.op, number=value)
    check_string_operator(predicate, error)
    text = predicate.value
    negate = predicate.op == "!="
    match = "full"
    if predicate.op == "~":
        if text.startswith("!"):
            negate, text = True, text[1:]
        match, text = glob_kind(text)
        if match == "glob":
            raise error(
                f"the bpf engine compiles globs of the forms abc*, *abc and *abc*, not {text!r}",
                predicate.value_column,
                hint="the kernel's full glob match needs the tracefs engine (--engine tracefs)",
            )
    pattern = text.encode("utf-8", "surrogateescape")
    if len(pattern) >= MAX_STRING:
        raise error("the string is longer than any fetched string can be", predicate.value_column)
    if match == "middle" and len(pattern) > MAX_MIDDLE_PATTERN:
        raise error(
            f"a *text* pattern is compiled for up to {MAX_MIDDLE_PATTERN} bytes",
            predicate.value_column,
        )
    return PredicatePlan(place, predicate.op, pattern=pattern, match=match, negate=negate)


def filter_emitter(
    tree: Expression, plans: dict[Predicate, PredicatePlan]
) -> Callable[[Emitter, str], None]:
    """The code emitter: jumps to the drop label when the record does not match."""

    def emit(e: Emitter, drop: str) -> None:
        keep = e.fresh("keep")
        _condition(e, tree, plans, keep, drop)
        e.label(keep)

    return emit


def _condition(
    e: Emitter, tree: Expression, plans: dict[Predicate, PredicatePlan], true: str, false: str
) -> None:
    if isinstance(tree, Or):
        middle = e.fresh("or")
        _condition(e, tree.left, plans, true, middle)
        e.label(middle)
        _condition(e, tree.right, plans, true, false)
    elif isinstance(tree, And):
        middle = e.fresh("and")
        _condition(e, tree.left, plans, middle, false)
        e.label(middle)
        _condition(e, tree.right, plans, true, false)
    elif isinstance(tree, Not):
        _condition(e, tree.operand, plans, false, true)
    else:
        plan = plans[tree]
        if isinstance(plan.place, NumberField):
            _number(e, plan, plan.place, true, false)
        elif plan.negate:
            _string(e, plan, false, true)
        else:
            _string(e, plan, true, false)


_SIGNED_JUMPS = {"==": Jmp.JEQ, "!=": Jmp.JNE, "<": Jmp.JSLT, "<=": Jmp.JSLE, ">": Jmp.JSGT}
_SIGNED_JUMPS[">="] = Jmp.JSGE
_UNSIGNED_JUMPS = {"==": Jmp.JEQ, "!=": Jmp.JNE, "<": Jmp.JLT, "<=": Jmp.JLE, ">": Jmp.JGT}
_UNSIGNED_JUMPS[">="] = Jmp.JGE


def _number(e: Emitter, plan: PredicatePlan, place: NumberField, true: str, false: str) -> None:
    e.emit(ldx(place.size, Reg.R1, RECORD, place.offset))
    if place.signed and place.size < 8:
        shift = 64 - 8 * place.size
        e.emit(alu64_imm(Alu.LSH, Reg.R1, shift), alu64_imm(Alu.ARSH, Reg.R1, shift))
    value = plan.number
    if plan.op == "&":
        jump = Jmp.JSET
    else:
        jump = (_SIGNED_JUMPS if place.signed else _UNSIGNED_JUMPS)[plan.op]
    as_signed = value - (1 << 64) if value >= 1 << 63 else value
    if -(1 << 31) <= as_signed < 1 << 31:
        e.jump(jump, Reg.R1, as_signed, true)
    else:
        e.emit(ld_imm64(Reg.R2, value))
        e.jump(jump, Reg.R1, Reg.R2, true)
    e.goto(false)


def _string(e: Emitter, plan: PredicatePlan, true: str, false: str) -> None:
    """r1 = the string's record offset, r2 = its length (as the kernel counts it); then the
    match, with every read bounded for the verifier."""
    place = plan.place
    pattern = plan.pattern
    if isinstance(place, FixedString):
        e.emit(mov64_imm(Reg.R1, place.offset), mov64_imm(Reg.R2, place.size))
        area = place.offset + place.size
    else:
        assert isinstance(place, LocatedString)
        e.emit(ldx(4, Reg.R3, RECORD, place.word), mov64_reg(Reg.R2, Reg.R3))
        e.emit(alu64_imm(Alu.RSH, Reg.R2, 16), alu64_imm(Alu.AND, Reg.R3, 0xFFFF))
        e.emit(mov64_reg(Reg.R1, Reg.R3), alu64_imm(Alu.ADD, Reg.R1, place.base))
        area = place.area
        # a fault (length 0) compares as the empty string
        empty = true if not pattern and plan.match != "end" else false
        e.jump(Jmp.JEQ, Reg.R2, 0, empty)
        e.jump(Jmp.JGT, Reg.R2, MAX_STRING, false)
    if plan.match in ("front", "middle") and not pattern:
        e.goto(true)  # every string starts with and contains the empty string
    elif plan.match == "full":
        compared = pattern + b"\0"
        if isinstance(place, FixedString):
            compared = compared[: place.size]  # strncmp over the array's size
        _compare_prefix(e, compared, area, true, false, stop_at_length=True)
    elif plan.match == "front":
        if isinstance(place, LocatedString):
            e.jump(Jmp.JLT, Reg.R2, len(pattern), false)
        _compare_prefix(e, pattern, area, true, false, stop_at_length=False)
    elif plan.match == "end":
        # the last len(pattern) bytes before the string's last byte (length - 1)
        e.jump(Jmp.JLT, Reg.R2, len(pattern) + 1, false)
        e.emit(alu64_reg(Alu.ADD, Reg.R1, Reg.R2), alu64_imm(Alu.SUB, Reg.R1, len(pattern) + 1))
        _compare_prefix(e, pattern, area, true, false, stop_at_length=False)
    else:
        _search(e, pattern, area, true, false)


def _compare_prefix(
    e: Emitter, pattern: bytes, area: int, true: str, false: str, *, stop_at_length: bool
) -> None:
    """The bytes at record offset r1 equal `pattern` (with `stop_at_length`, the comparison
    also ends with a match after r2 bytes, as strncmp(str, pattern, r2) does)."""
    if pattern:
        e.jump(Jmp.JGT, Reg.R1, area - len(pattern), false)
    e.emit(mov64_reg(Reg.R4, RECORD), alu64_reg(Alu.ADD, Reg.R4, Reg.R1))
    for index, byte in enumerate(pattern):
        if stop_at_length:
            e.jump(Jmp.JLE, Reg.R2, index, true)
        e.emit(ldx(1, Reg.R0, Reg.R4, index))
        e.jump(Jmp.JNE, Reg.R0, byte, false)
    e.goto(true)


SEARCH_FRAME = -64
"""fp-64..fp-33: the search's state handed to its bpf_loop callback: the record pointer, the
string's record offset, its length, and the found flag."""


def _search(e: Emitter, pattern: bytes, area: int, true: str, false: str) -> None:
    """strnstr(str, pattern, r2): `pattern` starts at one of the first r2 - len + 1 bytes.
    A bpf_loop callback tries one position per call, so the verifier checks it once."""
    frame = SEARCH_FRAME

    def try_position(f: Emitter) -> None:
        # r1 = position, r2 = the caller's frame
        stop = f.fresh("stop")
        f.emit(ldx(8, Reg.R3, Reg.R2, 16), alu64_reg(Alu.SUB, Reg.R3, Reg.R1))
        f.jump(Jmp.JSLT, Reg.R3, len(pattern), stop)
        f.emit(ldx(8, Reg.R5, Reg.R2, 8), alu64_reg(Alu.ADD, Reg.R5, Reg.R1))
        f.jump(Jmp.JGT, Reg.R5, area - len(pattern), stop)
        f.emit(ldx(8, Reg.R4, Reg.R2, 0), alu64_reg(Alu.ADD, Reg.R4, Reg.R5))
        mismatch = f.fresh("mismatch")
        for index, byte in enumerate(pattern):
            f.emit(ldx(1, Reg.R0, Reg.R4, index))
            f.jump(Jmp.JNE, Reg.R0, byte, mismatch)
        f.emit(mov64_imm(Reg.R0, 1), stx(8, Reg.R2, 24, Reg.R0), exit_insn())
        f.label(mismatch)
        f.emit(mov64_imm(Reg.R0, 0), exit_insn())
        f.label(stop)
        f.emit(mov64_imm(Reg.R0, 1), exit_insn())

    callback = e.subprogram("search", try_position)
    e.emit(stx(8, Reg.FP, frame, RECORD), stx(8, Reg.FP, frame + 8, Reg.R1))
    e.emit(stx(8, Reg.FP, frame + 16, Reg.R2), st_imm(8, Reg.FP, frame + 24, 0))
    e.emit(mov64_reg(Reg.R1, Reg.R2))
    e.function_address(Reg.R2, callback)
    e.emit(mov64_reg(Reg.R3, Reg.FP), alu64_imm(Alu.ADD, Reg.R3, frame), mov64_imm(Reg.R4, 0))
    e.call(Helper.LOOP)
    e.emit(ldx(8, Reg.R0, Reg.FP, frame + 24))
    e.jump(Jmp.JNE, Reg.R0, 0, true)
    e.goto(false)
