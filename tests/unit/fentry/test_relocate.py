"""Displaced instructions re-encoded at the stub keep their meaning: same branch targets, same
RIP-relative operands."""

from __future__ import annotations

import capstone
import pytest

from probescope.engines.fentry.relocate import (
    CALL,
    Refused,
    classify,
    decode_all,
    relocate,
    relocated_size,
)

_DECODER = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_DECODER.detail = True
ORIGINAL = 0x7F0000001000
STUB = 0x7F0000801000


def moved(code: bytes, **kwargs: bool) -> tuple[list[object], list[object]]:
    """(instructions at ORIGINAL, the same relocated to STUB)."""
    before = decode_all(code, ORIGINAL)
    displaced = tuple(classify(insn, ORIGINAL, **kwargs) for insn in before)
    out = relocate(displaced, ORIGINAL, STUB)
    assert len(out) == relocated_size(displaced)
    return before, list(_DECODER.disasm(out, STUB))


def test_rip_relative_operand_points_at_the_same_address() -> None:
    before, after = moved(bytes.fromhex("8b0500100000"))  # mov eax, [rip + 0x1000]
    target = ORIGINAL + 6 + 0x1000
    assert after[0].disp + after[0].address + after[0].size == target
    assert before[0].size == after[0].size


@pytest.mark.parametrize(
    "code",
    [
        "7405",  # je +5 (rel8)
        "0f8405000000",  # je +5 (rel32)
        "eb10",  # jmp +16 (rel8)
        "3e7405",  # je with a branch hint
    ],
)
def test_branches_keep_their_target_in_rel32_form(code: str) -> None:
    before, after = moved(bytes.fromhex(code))
    assert before[0].operands[0].imm == after[0].operands[0].imm
    assert after[0].size in (5, 6)
    assert after[0].mnemonic == before[0].mnemonic


def test_calls_move_only_for_the_engines_own_hooks() -> None:
    code = bytes.fromhex("e800010000")
    with pytest.raises(Refused, match="a call"):
        moved(code)
    before, after = moved(code, allow_calls=True)
    assert classify(decode_all(code, ORIGINAL)[0], ORIGINAL, allow_calls=True).kind == CALL
    assert before[0].operands[0].imm == after[0].operands[0].imm


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("e2fe", "no 32-bit form"),  # loop
        ("e3fe", "no 32-bit form"),  # jrcxz
        ("ffe0", "indirect jump"),  # jmp rax
        ("cc", "cannot be displaced"),  # int3
        ("c20800", "cannot be displaced"),  # ret 8
    ],
)
def test_refused(code: str, why: str) -> None:
    with pytest.raises(Refused, match=why):
        moved(bytes.fromhex(code))


def test_a_target_out_of_rel32_reach_is_refused() -> None:
    insn = decode_all(bytes.fromhex("8b0500000000"), ORIGINAL)[0]
    displaced = (classify(insn, ORIGINAL),)
    with pytest.raises(Refused, match="over 2 GiB"):
        relocate(displaced, ORIGINAL, ORIGINAL + (3 << 30))
