"""User stacks from a copy of the stack: walked by frame pointers, or unwound with DWARF CFI.

A probe that asks for a user stack copies, at the hit, the registers an unwinder needs and the
top of the stack (`stack_capture`). This module turns such a sample into the return addresses of
the calls in progress, innermost first:

- `fp`: the kernel's own user walk (`arch_stack_walk_user`): the ip, then pairs (saved rbp,
  return address) from rbp upwards. At a function's first instruction (before `push %rbp`)
  rbp still holds the caller's frame, which would skip the immediate caller: the return
  address at [sp] is inserted there, as perf does for uprobes at function entry.
- `dwarf`: the CFI row of each pc (`symbols.cfi`) gives the caller's stack pointer (CFA), where
  the return address and the callee-saved registers were stored; frames without CFI fall back
  to the frame pointer. Debian's libc and python3.11 have no frame pointers, so only this
  method sees through them (perf's `--call-graph dwarf` is the reference).

Both stop at a zero or unreadable return address, at a stack pointer that does not grow, at a
read outside the copied stack, or after `max_frames`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from probescope.symbols.cfi import CfiRow

RIP, RSP, RBP, RBX = 16, 7, 6, 3
CALLEE_SAVED = (3, 6, 12, 13, 14, 15)
MAX_FRAMES = 127
_WORD = struct.Struct("<Q")
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class StackSample:
    """What a probe copied at a hit: DWARF-numbered registers (16 = ip, 7 = sp, 6 = bp ...),
    the stack bytes from sp upwards, and whether the probe sits on a function's first byte."""

    registers: dict[int, int]
    stack: bytes
    at_function_entry: bool = False

    @property
    def sp(self) -> int:
        return self.registers[RSP]

    def read_word(self, address: int) -> int | None:
        offset = address - self.registers[RSP]
        if offset < 0 or offset + 8 > len(self.stack):
            return None
        value: int = _WORD.unpack_from(self.stack, offset)[0]
        return value


CodeLookup = Callable[[int], tuple[CfiRow | None, int] | None]
"""`lookup(runtime pc)` → (CFI row covering it or None, load bias), or None for an address no
file mapping holds (the unwinder then stops at CFI-less code unless frame pointers help)."""


def walk_frame_pointers(sample: StackSample, *, max_frames: int = MAX_FRAMES) -> list[int]:
    """The frame-pointer walk of the copied stack."""
    registers = sample.registers
    pcs = [registers[RIP]]
    if sample.at_function_entry:
        caller = sample.read_word(sample.sp)
        if caller:
            pcs.append(caller)
    frame = registers.get(RBP, 0)
    while len(pcs) < max_frames:
        if frame < sample.sp:
            break
        next_frame = sample.read_word(frame)
        address = sample.read_word(frame + 8)
        if next_frame is None or not address:
            break
        pcs.append(address)
        if next_frame <= frame:
            break
        frame = next_frame
    return pcs


def unwind_dwarf(
    sample: StackSample, lookup: CodeLookup, *, max_frames: int = MAX_FRAMES
) -> list[int]:
    """The CFI unwind of the copied stack (frame pointers where a pc has no CFI)."""
    registers = dict(sample.registers)
    pcs = [registers[RIP]]
    first = True
    while len(pcs) < max_frames:
        pc = registers[RIP]
        found = lookup(pc if first else pc - 1)
        row, bias = found if found is not None else (None, 0)
        if row is None:
            following = _frame_pointer_step(sample, registers, first)
        else:
            following = _cfi_step(sample, registers, row, bias)
        if following is None:
            break
        address = following[RIP]
        if not address or following[RSP] <= registers[RSP]:
            break
        pcs.append(address)
        registers = following
        first = False
    return pcs


def _frame_pointer_step(
    sample: StackSample, registers: dict[int, int], first: bool
) -> dict[int, int] | None:
    frame = registers.get(RBP)
    if frame is None or frame < registers[RSP]:
        return None
    next_frame = sample.read_word(frame)
    address = sample.read_word(frame + 8)
    if next_frame is None or address is None:
        return None
    following = dict(registers)
    following[RIP] = address
    following[RSP] = frame + 16
    following[RBP] = next_frame
    return following


def _cfi_step(
    sample: StackSample, registers: dict[int, int], row: CfiRow, bias: int
) -> dict[int, int] | None:
    if row.cfa_expression is not None:
        cfa = _evaluate(row.cfa_expression, registers, sample)
        if cfa is None:
            return None
    else:
        if row.cfa_register is None or row.cfa_register not in registers:
            return None
        cfa = (registers[row.cfa_register] + row.cfa_offset) & _MASK
    following: dict[int, int] = {}
    for register in CALLEE_SAVED:
        if register in registers:
            following[register] = registers[register]
    return_address: int | None = None
    for register, kind, argument in row.registers:
        value: int | None
        if kind == "offset":
            value = sample.read_word((cfa + argument) & _MASK)
        elif kind == "val_offset":
            value = (cfa + argument) & _MASK
        elif kind == "same":
            value = registers.get(register)
        elif kind == "register":
            value = registers.get(argument)
        else:  # undefined, or an expression rule this unwinder does not evaluate
            value = None
        if register == RIP:
            return_address = value
            if kind == "undefined":
                return None  # the outermost frame (_start, clone's child)
        elif value is None:
            following.pop(register, None)
        else:
            following[register] = value
    if return_address is None:
        return None
    following[RIP] = return_address
    following[RSP] = cfa
    return following


def _evaluate(
    expression: tuple[tuple[str, tuple[int, ...]], ...],
    registers: dict[int, int],
    sample: StackSample,
) -> int | None:
    """A CFA expression: the operations compilers emit for PLT entries and realigned stacks."""
    stack: list[int] = []
    for name, operands in expression:
        if name.startswith("DW_OP_breg"):
            register = int(name[len("DW_OP_breg") :])
            if register not in registers:
                return None
            stack.append((registers[register] + operands[0]) & _MASK)
        elif name.startswith("DW_OP_lit"):
            stack.append(int(name[len("DW_OP_lit") :]))
        elif name.startswith("DW_OP_const"):
            stack.append(operands[0] & _MASK)
        elif name == "DW_OP_plus_uconst" and stack:
            stack.append((stack.pop() + operands[0]) & _MASK)
        elif name == "DW_OP_deref" and stack:
            value = sample.read_word(stack.pop())
            if value is None:
                return None
            stack.append(value)
        elif name in _BINARY and len(stack) >= 2:
            right, left = stack.pop(), stack.pop()
            stack.append(_BINARY[name](left, right) & _MASK)
        else:
            return None
    return stack[-1] if stack else None


_BINARY: dict[str, Callable[[int, int], int]] = {
    "DW_OP_plus": lambda a, b: a + b,
    "DW_OP_minus": lambda a, b: a - b,
    "DW_OP_and": lambda a, b: a & b,
    "DW_OP_or": lambda a, b: a | b,
    "DW_OP_shl": lambda a, b: a << b,
    "DW_OP_shr": lambda a, b: a >> b,
    "DW_OP_mul": lambda a, b: a * b,
    "DW_OP_ge": lambda a, b: int(_signed(a) >= _signed(b)),
    "DW_OP_gt": lambda a, b: int(_signed(a) > _signed(b)),
    "DW_OP_le": lambda a, b: int(_signed(a) <= _signed(b)),
    "DW_OP_lt": lambda a, b: int(_signed(a) < _signed(b)),
    "DW_OP_eq": lambda a, b: int(a == b),
    "DW_OP_ne": lambda a, b: int(a != b),
}


def _signed(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value
