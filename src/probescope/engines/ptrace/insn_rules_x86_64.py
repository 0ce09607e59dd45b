"""Which x86_64 instructions can carry a uprobe: the kernel's validity tables and prefix rules
(arch/x86/kernel/uprobes.c `good_insns_64`, `good_2byte_insns`, `is_prefix_bad`), the opcode
split its instruction decoder makes, and the jcc conditions (`CASE_COND`) emulation tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from probescope.errors import PtraceError

# ---------------------------------------------------------------------------------------------
# The kernel's instruction validity tables (arch/x86/kernel/uprobes.c), one bit per opcode.


def _bits(rows: list[str]) -> frozenset[int]:
    good = set()
    for row, text in enumerate(rows):
        for column, bit in enumerate(text.split()):
            if bit == "1":
                good.add(row * 16 + column)
    return frozenset(good)


GOOD_INSNS_64: Final = _bits([
    "1 1 1 1 1 1 0 0 1 1 1 1 1 1 0 0",  # 00
    "1 1 1 1 1 1 0 0 1 1 1 1 1 1 0 0",  # 10
    "1 1 1 1 1 1 0 0 1 1 1 1 1 1 0 0",  # 20
    "1 1 1 1 1 1 0 0 1 1 1 1 1 1 0 0",  # 30
    "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0",  # 40
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 50
    "0 0 0 1 1 1 0 0 1 1 1 1 0 0 0 0",  # 60
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 70
    "1 1 0 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 80
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 90
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # a0
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # b0
    "1 1 1 1 0 0 1 1 1 1 1 1 0 0 0 0",  # c0
    "1 1 1 1 0 0 0 1 1 1 1 1 1 1 1 1",  # d0
    "1 1 1 1 0 0 0 0 1 1 1 1 0 0 0 0",  # e0
    "0 0 1 1 0 1 1 1 1 1 0 0 1 1 1 1",  # f0
])  # fmt: skip

GOOD_2BYTE_INSNS: Final = _bits([
    "0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 1",  # 00
    "1 1 1 1 1 1 1 1 0 1 1 1 1 1 1 1",  # 10
    "1 1 1 1 0 0 0 0 1 1 1 1 1 1 1 1",  # 20
    "0 1 1 1 0 0 0 0 0 0 0 0 0 0 0 0",  # 30
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 40
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 50
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 60
    "1 1 1 1 1 1 1 1 0 0 0 0 0 0 1 1",  # 70
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 80
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # 90
    "1 1 1 1 1 1 0 0 1 1 1 1 1 1 0 1",  # a0
    "1 1 1 1 1 1 1 1 0 1 1 1 1 1 1 1",  # b0
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # c0
    "0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # d0
    "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",  # e0
    "0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 0",  # f0
])  # fmt: skip

_LEGACY_PREFIXES: Final = frozenset(
    {0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF0, 0xF2, 0xF3}
)
_BAD_PREFIXES: Final = {0x26: "es", 0x2E: "cs", 0x36: "ss", 0x3E: "ds", 0xF0: "lock"}

# The kernel's CASE_COND: (flag test) per even opcode; the odd opcode is its negation.
OF, CF, ZF, SF, PF = 0x800, 0x1, 0x40, 0x80, 0x4  # eflags bits
CONDITIONS: Final[dict[int, Callable[[int], bool]]] = {
    0x70: lambda f: bool(f & OF),
    0x72: lambda f: bool(f & CF),
    0x74: lambda f: bool(f & ZF),
    0x76: lambda f: bool(f & CF) or bool(f & ZF),
    0x78: lambda f: bool(f & SF),
    0x7A: lambda f: bool(f & PF),
    0x7C: lambda f: bool(f & SF) != bool(f & OF),
    0x7E: lambda f: bool(f & ZF) or (bool(f & SF) != bool(f & OF)),
}


def condition_holds(opcode: int, flags: int) -> bool:
    """Whether jcc `opcode` (0x70..0x7f) is taken under `flags`."""
    taken = CONDITIONS[opcode & 0xFE](flags)
    return taken if opcode & 1 == 0 else not taken


class UnsupportedInstruction(PtraceError):
    """The probed instruction cannot carry a probe (the kernel refuses it too, or it cannot be
    executed out of line)."""


@dataclass(frozen=True)
class Encoding:
    prefixes: tuple[int, ...]
    rex: int | None
    rex_offset: int | None
    vex_offset: int | None  # offset of the c4/c5/62 byte
    vex_kind: int | None  # 0xc4, 0xc5, 0x62
    opcode_offset: int
    opcode: tuple[int, ...]  # opcode bytes as the kernel's decoder counts them


def encoding(code: bytes) -> Encoding:
    """Legacy prefixes, REX, VEX/EVEX and opcode bytes, the way the kernel's insn decoder
    splits them (for the validity tables)."""
    i = 0
    prefixes: list[int] = []
    while i < len(code) and code[i] in _LEGACY_PREFIXES:
        prefixes.append(code[i])
        i += 1
    rex = rex_offset = None
    if i < len(code) and 0x40 <= code[i] <= 0x4F:
        rex, rex_offset = code[i], i
        i += 1
    vex_offset = vex_kind = None
    if i < len(code) and code[i] in (0xC4, 0xC5, 0x62):
        vex_offset, vex_kind = i, code[i]
        i += {0xC5: 2, 0xC4: 3, 0x62: 4}[code[i]]
        return Encoding(
            tuple(prefixes),
            rex,
            rex_offset,
            vex_offset,
            vex_kind,
            i,
            (code[i],) if i < len(code) else (),
        )
    if i < len(code) and code[i] == 0x0F and i + 1 < len(code):
        if code[i + 1] in (0x38, 0x3A) and i + 2 < len(code):
            return Encoding(
                tuple(prefixes), rex, rex_offset, None, None, i, (0x0F, code[i + 1], code[i + 2])
            )
        return Encoding(tuple(prefixes), rex, rex_offset, None, None, i, (0x0F, code[i + 1]))
    return Encoding(
        tuple(prefixes), rex, rex_offset, None, None, i, (code[i],) if i < len(code) else ()
    )


def kernel_refusal(code: bytes) -> str | None:
    """Why arch_uprobe_analyze_insn would refuse this instruction, or None."""
    enc = encoding(code)
    bad = [name for p in enc.prefixes if (name := _BAD_PREFIXES.get(p))]
    if bad:
        return f"{bad[0]} prefix"
    if not enc.opcode:
        return "truncated instruction"
    first = enc.opcode[0]
    if first not in GOOD_INSNS_64 and not (
        len(enc.opcode) == 2 and enc.opcode[1] in GOOD_2BYTE_INSNS
    ):
        return "instruction class not allowed at a uprobe site"
    is_branch = (
        first in (0xE8, 0xE9, 0xEB, 0x90)
        or 0x70 <= first <= 0x7F
        or (len(enc.opcode) == 2 and first == 0x0F and 0x80 <= enc.opcode[1] <= 0x8F)
    )
    if is_branch and 0x66 in enc.prefixes:
        return "0x66-prefixed branch"
    return None
