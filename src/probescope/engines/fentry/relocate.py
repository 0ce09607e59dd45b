"""Displaced instructions: the first bytes of a function, moved into its stub and re-encoded.

A detour replaces a function's first instructions (at least 5 bytes) with `jmp stub`; the stub
runs them and jumps back. Each displaced instruction is decoded once from the file and
classified; at placement it is re-encoded for the stub's address: RIP-relative operands get
`disp + (original - new)`, `jmp`/`jcc` (rel8 or rel32) become rel32 forms aimed at the same
target, everything else is copied. What cannot move is refused with the reason: calls (the
return address would point into the stub), `loop`/`jrcxz`, indirect jumps, interrupts, and
instructions that read flags no earlier displaced instruction set (the stub does not preserve
the flags; plan.py checks that). A `ret` may be displaced only as the function's last
instruction.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

import capstone  # type: ignore[import-untyped]
from capstone import x86_const

_DISASSEMBLER = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_DISASSEMBLER.detail = True

JMP_SIZE = 5
ENDBR64 = b"\xf3\x0f\x1e\xfa"
_FLAGS = ("OF", "SF", "ZF", "PF", "CF", "AF")
_FLAG_TESTS = {flag: getattr(x86_const, f"X86_EFLAGS_TEST_{flag}") for flag in _FLAGS}
_FLAG_WRITES = {
    flag: getattr(x86_const, f"X86_EFLAGS_MODIFY_{flag}")
    | getattr(x86_const, f"X86_EFLAGS_SET_{flag}")
    | getattr(x86_const, f"X86_EFLAGS_RESET_{flag}")
    | getattr(x86_const, f"X86_EFLAGS_UNDEFINED_{flag}")
    for flag in _FLAGS
}

_BRANCH_PREFIXES = frozenset({0x2E, 0x3E, 0xF2, 0xF3})

PLAIN = "plain"
RIP_RELATIVE = "riprel"
JUMP = "jmp"
CONDITIONAL = "jcc"
RETURN = "ret"
CALL = "call"


class Refused(Exception):
    """A site the engine will not patch; `str()` is the reason, for the user."""


class Displaced(NamedTuple):
    """One displaced instruction: `offset` from the patch start, its bytes, how it moves."""

    offset: int
    raw: bytes
    text: str
    kind: str
    condition: int = 0  # jcc: the condition nibble (0x0..0xf)
    rel: int = 0  # jmp/jcc: target - end of the instruction
    disp_offset: int = 0  # riprel: where the 32-bit displacement sits in `raw`


def decode_all(code: bytes, address: int) -> list[Any]:
    """Capstone instructions (detail mode) of `code` at `address`, until undecodable bytes."""
    return list(_DISASSEMBLER.disasm(code, address))


def decode_lazily(code: bytes, address: int) -> Iterator[Any]:
    """The same, one at a time (detail mode is costly: decode only what is used)."""
    return iter(_DISASSEMBLER.disasm(code, address))


def flags_read(insn: Any) -> set[str]:
    """The arithmetic flags `insn` reads (capstone's EFLAGS detail)."""
    return {flag for flag, bit in _FLAG_TESTS.items() if insn.eflags & bit}


def flags_written(insn: Any) -> set[str]:
    return {flag for flag, bit in _FLAG_WRITES.items() if insn.eflags & bit}


def classify(insn: Any, patch_start: int, *, allow_calls: bool = False) -> Displaced:
    """How instruction `insn` (decoded at its link-time address) moves; raises Refused.

    `allow_calls` (the engine's own hooks into known library functions only): a direct call
    moves too, returning into the stub, which then jumps back."""
    offset = insn.address - patch_start
    raw = bytes(insn.bytes)
    text = f"{insn.mnemonic} {insn.op_str}".strip()
    groups = set(insn.groups)
    if insn.id == x86_const.X86_INS_INT3 or x86_const.X86_GRP_INT in groups:
        raise Refused(f"'{text}' at +{offset:#x} cannot be displaced")
    if x86_const.X86_GRP_CALL in groups:
        operand = insn.operands[0] if insn.operands else None
        if allow_calls and operand is not None and operand.type == x86_const.X86_OP_IMM:
            rel = int(operand.imm) - (insn.address + insn.size)
            return Displaced(offset, raw, text, CALL, rel=rel)
        raise Refused(
            f"a call ('{text}') in the first {JMP_SIZE} bytes: its return address would point "
            "into the stub"
        )
    if x86_const.X86_GRP_RET in groups:
        if insn.id in (x86_const.X86_INS_RET,) and raw in (b"\xc3", b"\xf3\xc3"):
            return Displaced(offset, raw, text, RETURN)
        raise Refused(f"'{text}' at +{offset:#x} cannot be displaced")
    if insn.id in (
        x86_const.X86_INS_LOOP,
        x86_const.X86_INS_LOOPE,
        x86_const.X86_INS_LOOPNE,
        x86_const.X86_INS_JRCXZ,
        x86_const.X86_INS_JECXZ,
    ):
        raise Refused(f"'{text}' in the first {JMP_SIZE} bytes has no 32-bit form to move to")
    if x86_const.X86_GRP_JUMP in groups:
        operand = insn.operands[0] if insn.operands else None
        if operand is None or operand.type != x86_const.X86_OP_IMM:
            raise Refused(f"an indirect jump ('{text}') in the first {JMP_SIZE} bytes")
        rel = int(operand.imm) - (insn.address + insn.size)
        if insn.id == x86_const.X86_INS_JMP:
            return Displaced(offset, raw, text, JUMP, rel=rel)
        at = 0
        while at < len(raw) - 1 and raw[at] in _BRANCH_PREFIXES:
            at += 1  # branch hints, bnd, notrack: the rel32 form goes without them
        if raw[at] == 0x0F:
            condition = raw[at + 1] & 0x0F
        elif 0x70 <= raw[at] <= 0x7F:
            condition = raw[at] & 0x0F
        else:
            raise Refused(f"'{text}' at +{offset:#x}: unexpected branch encoding {raw.hex()}")
        return Displaced(offset, raw, text, CONDITIONAL, condition=condition, rel=rel)
    if insn.disp_size == 4 and _rip_relative(insn):
        return Displaced(offset, raw, text, RIP_RELATIVE, disp_offset=insn.disp_offset)
    if insn.id in (x86_const.X86_INS_SYSENTER, x86_const.X86_INS_SYSEXIT):
        raise Refused(f"'{text}' at +{offset:#x} cannot be displaced")
    return Displaced(offset, raw, text, PLAIN)


def _rip_relative(insn: Any) -> bool:
    return any(
        op.type == x86_const.X86_OP_MEM and op.mem.base == x86_const.X86_REG_RIP
        for op in insn.operands
    )


def relocate(displaced: tuple[Displaced, ...], original: int, new: int) -> bytes:
    """The displaced instructions re-encoded to run at `new` (they were at `original`)."""
    out = bytearray()
    for item in displaced:
        here = new + len(out)
        source = original + item.offset
        if item.kind == PLAIN or item.kind == RETURN:
            out += item.raw
        elif item.kind == RIP_RELATIVE:
            code = bytearray(item.raw)
            (disp,) = struct.unpack_from("<i", code, item.disp_offset)
            disp += source - here
            _check_rel32(disp, item)
            struct.pack_into("<i", code, item.disp_offset, disp)
            out += code
        elif item.kind in (JUMP, CALL):
            target = source + len(item.raw) + item.rel
            rel = target - (here + 5)
            _check_rel32(rel, item)
            out += (b"\xe9" if item.kind == JUMP else b"\xe8") + struct.pack("<i", rel)
        elif item.kind == CONDITIONAL:
            target = source + len(item.raw) + item.rel
            rel = target - (here + 6)
            _check_rel32(rel, item)
            out += bytes((0x0F, 0x80 | item.condition)) + struct.pack("<i", rel)
        else:  # pragma: no cover - classify() produces only the kinds above
            raise Refused(f"unknown displaced kind {item.kind}")
    return bytes(out)


def relocated_size(displaced: tuple[Displaced, ...]) -> int:
    """Bytes relocate() produces (branches grow to their rel32 forms)."""
    size = 0
    for item in displaced:
        if item.kind in (JUMP, CALL):
            size += 5
        elif item.kind == CONDITIONAL:
            size += 6
        else:
            size += len(item.raw)
    return size


def _check_rel32(value: int, item: Displaced) -> None:
    if not -(1 << 31) <= value < 1 << 31:
        raise Refused(f"'{item.text}' cannot reach its target from the stub (over 2 GiB away)")


def jump(source: int, target: int) -> bytes:
    """`jmp target` at `source` (rel32; the code area is always within reach)."""
    rel = target - (source + JMP_SIZE)
    if not -(1 << 31) <= rel < 1 << 31:
        raise Refused(f"jump from {source:#x} to {target:#x} is out of rel32 reach")
    return b"\xe9" + struct.pack("<i", rel)
