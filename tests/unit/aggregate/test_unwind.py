"""The unwinders on hand-made stack copies: frame pointers (with the return address a walk
from a function's first instruction needs), CFI rows, and PLT-style CFA expressions."""

from __future__ import annotations

import struct

from probescope.aggregate.unwind import (
    RBP,
    RIP,
    RSP,
    StackSample,
    _evaluate,
    unwind_dwarf,
    walk_frame_pointers,
)
from probescope.symbols.cfi import CfiRow

SP = 0x7FFF0000


def words(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def test_frame_pointer_walk() -> None:
    # [sp]=ret into caller (entry), frame at SP+16: saved rbp (SP+48), ret 0x2222;
    # frame at SP+48: saved rbp 0, ret 0x3333
    stack = words(0x1111, 0, SP + 48, 0x2222, 0, 0, SP + 64, 0x3333, 0, 0)
    sample = StackSample({RIP: 0x1000, RSP: SP, RBP: SP + 16}, stack, at_function_entry=True)
    assert walk_frame_pointers(sample) == [0x1000, 0x1111, 0x2222, 0x3333]
    not_entry = StackSample({RIP: 0x1000, RSP: SP, RBP: SP + 16}, stack)
    assert walk_frame_pointers(not_entry) == [0x1000, 0x2222, 0x3333]


def test_cfi_unwind_without_frame_pointers() -> None:
    # leaf at entry: CFA = sp+8, RA at CFA-8. caller: CFA = sp+32, RA at CFA-8, rbx at CFA-16.
    stack = words(0x2005, 0x11, 0x22, 0xBB, 0x3005, 0)
    rows = {
        0x1000: CfiRow(0x1000, 0x1010, 7, 8, None, ((16, "offset", -8),)),
        0x2004: CfiRow(0x2000, 0x2010, 7, 32, None, ((16, "offset", -8), (3, "offset", -16))),
        0x3004: CfiRow(0x3000, 0x3010, 7, 8, None, ((16, "undefined", 0),)),
    }

    def lookup(pc: int) -> tuple[CfiRow | None, int] | None:
        return rows.get(pc), 0

    sample = StackSample({RIP: 0x1000, RSP: SP, RBP: 0, 3: 0}, stack)
    assert unwind_dwarf(sample, lookup) == [0x1000, 0x2005, 0x3005]


def test_unwinding_stops_at_the_end_of_the_copy() -> None:
    sample = StackSample({RIP: 0x1000, RSP: SP}, words(0x2005))
    row = CfiRow(0x1000, 0x1010, 7, 64, None, ((16, "offset", -8),))
    assert unwind_dwarf(sample, lambda pc: (row, 0)) == [0x1000]


def test_plt_cfa_expression() -> None:
    expression = (
        ("DW_OP_breg7", (8,)),
        ("DW_OP_breg16", (0,)),
        ("DW_OP_lit15", ()),
        ("DW_OP_and", ()),
        ("DW_OP_lit11", ()),
        ("DW_OP_ge", ()),
        ("DW_OP_lit3", ()),
        ("DW_OP_shl", ()),
        ("DW_OP_plus", ()),
    )
    sample = StackSample({RSP: SP}, b"")
    assert _evaluate(expression, {RSP: SP, RIP: 0x1004}, sample) == SP + 8
    assert _evaluate(expression, {RSP: SP, RIP: 0x100B}, sample) == SP + 16
