"""The instruction emitter against hand-assembled bytes.

Each expected value is written out field by field from Documentation/bpf/standardization/
instruction-set.rst: opcode byte, then `src << 4 | dst`, then the 16-bit offset and the 32-bit
immediate, little-endian. The opcodes are the ones the kernel's verifier log prints in
parentheses (`(79) r0 = *(u64 *)(r1 +8)`).
"""

from __future__ import annotations

import pytest

from probescope.engines.bpf.abi import Helper
from probescope.engines.bpf.insn import (
    Alu,
    Emitter,
    Jmp,
    Reg,
    alu32_imm,
    alu64_imm,
    alu64_reg,
    atomic_add,
    atomic_cmpxchg,
    call,
    exit_insn,
    ja,
    jmp_imm,
    jmp_reg,
    ld_imm64,
    ld_map_fd,
    ldx,
    mov32_reg,
    mov64_imm,
    mov64_reg,
    st_imm,
    stx,
)
from probescope.errors import BpfError


def insn(opcode: int, regs: int, off: int, imm: int) -> bytes:
    return (
        bytes([opcode, regs])
        + off.to_bytes(2, "little", signed=True)
        + imm.to_bytes(4, "little", signed=True)
    )


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        # r0 = 0: ALU64 | MOV | K = 0x07 | 0xb0 | 0x00
        (mov64_imm(Reg.R0, 0), insn(0xB7, 0x00, 0, 0)),
        # r6 = r1: ALU64 | MOV | X = 0xbf, src 1, dst 6
        (mov64_reg(Reg.R6, Reg.R1), insn(0xBF, 0x16, 0, 0)),
        # w3 = w9: ALU | MOV | X = 0xbc
        (mov32_reg(Reg.R3, Reg.R9), insn(0xBC, 0x93, 0, 0)),
        # r2 += -16: ALU64 | ADD | K = 0x07
        (alu64_imm(Alu.ADD, Reg.R2, -16), insn(0x07, 0x02, 0, -16)),
        # r0 >>= 32: ALU64 | RSH | K = 0x77
        (alu64_imm(Alu.RSH, Reg.R0, 32), insn(0x77, 0x00, 0, 32)),
        # r1 s>>= 56: ALU64 | ARSH | K = 0xc7
        (alu64_imm(Alu.ARSH, Reg.R1, 56), insn(0xC7, 0x01, 0, 56)),
        # r8 += r0: ALU64 | ADD | X = 0x0f
        (alu64_reg(Alu.ADD, Reg.R8, Reg.R0), insn(0x0F, 0x08, 0, 0)),
        # r1 |= r2: ALU64 | OR | X = 0x4f
        (alu64_reg(Alu.OR, Reg.R1, Reg.R2), insn(0x4F, 0x21, 0, 0)),
        # r0 *= 4: ALU64 | MUL | K = 0x27
        (alu64_imm(Alu.MUL, Reg.R0, 4), insn(0x27, 0x00, 0, 4)),
        # w1 &= 0xffff: ALU | AND | K = 0x54
        (alu32_imm(Alu.AND, Reg.R1, 0xFFFF), insn(0x54, 0x01, 0, 0xFFFF)),
        # r0 = *(u64 *)(r1 + 8): LDX | DW | MEM = 0x79
        (ldx(8, Reg.R0, Reg.R1, 8), insn(0x79, 0x10, 8, 0)),
        # r1 = *(u8 *)(r4 + 3): LDX | B | MEM = 0x71
        (ldx(1, Reg.R1, Reg.R4, 3), insn(0x71, 0x41, 3, 0)),
        # r1 = *(u32 *)(r10 - 16): LDX | W | MEM = 0x61
        (ldx(4, Reg.R1, Reg.FP, -16), insn(0x61, 0xA1, -16, 0)),
        # r1 = *(u16 *)(r6 + 2): LDX | H | MEM = 0x69
        (ldx(2, Reg.R1, Reg.R6, 2), insn(0x69, 0x61, 2, 0)),
        # *(u32 *)(r10 - 16) = r0: STX | W | MEM = 0x63
        (stx(4, Reg.FP, -16, Reg.R0), insn(0x63, 0x0A, -16, 0)),
        # *(u64 *)(r7 + 0) = r0: STX | DW | MEM = 0x7b
        (stx(8, Reg.R7, 0, Reg.R0), insn(0x7B, 0x07, 0, 0)),
        # *(u64 *)(r7 + 16) = 0: ST | DW | MEM = 0x7a
        (st_imm(8, Reg.R7, 16, 0), insn(0x7A, 0x07, 16, 0)),
        # *(u16 *)(r7 + 4) = 7: ST | H | MEM = 0x6a
        (st_imm(2, Reg.R7, 4, 7), insn(0x6A, 0x07, 4, 7)),
        # lock *(u64 *)(r0 + 0) += r1: STX | DW | ATOMIC = 0xdb, imm BPF_ADD
        (atomic_add(8, Reg.R0, 0, Reg.R1), insn(0xDB, 0x10, 0, 0x00)),
        # r0 = cmpxchg(*(u64 *)(r7 + 8), r0, r1): imm BPF_CMPXCHG = 0xf0 | BPF_FETCH
        (atomic_cmpxchg(8, Reg.R7, 8, Reg.R1), insn(0xDB, 0x17, 8, 0xF1)),
        # if r0 == 0 goto +2: JMP | JEQ | K = 0x15
        (jmp_imm(Jmp.JEQ, Reg.R0, 0, 2), insn(0x15, 0x00, 2, 0)),
        # if r0 s<= 0 goto -3: JMP | JSLE | K = 0xd5
        (jmp_imm(Jmp.JSLE, Reg.R0, 0, -3), insn(0xD5, 0x00, -3, 0)),
        # if r0 != -14 goto +1: JMP | JNE | K = 0x55, imm -EFAULT
        (jmp_imm(Jmp.JNE, Reg.R0, -14, 1), insn(0x55, 0x00, 1, -14)),
        # if r1 > r2 goto +5: JMP | JGT | X = 0x2d
        (jmp_reg(Jmp.JGT, Reg.R1, Reg.R2, 5), insn(0x2D, 0x21, 5, 0)),
        # if r1 & 0x4 goto +1: JMP | JSET | K = 0x45
        (jmp_imm(Jmp.JSET, Reg.R1, 4, 1), insn(0x45, 0x01, 1, 4)),
        # goto +7: JMP | JA = 0x05
        (ja(7), insn(0x05, 0x00, 7, 0)),
        # call bpf_get_current_pid_tgid#14: JMP | CALL = 0x85
        (call(Helper.GET_CURRENT_PID_TGID), insn(0x85, 0x00, 0, 14)),
        # exit: JMP | EXIT = 0x95
        (exit_insn(), insn(0x95, 0x00, 0, 0)),
    ],
)
def test_single_instructions(built: object, expected: bytes) -> None:
    assert built.encode() == expected  # type: ignore[attr-defined]


def test_u32_immediates_are_stored_as_the_s32_field_holds_them() -> None:
    assert alu32_imm(Alu.AND, Reg.R1, 0xFFFFFFFF).encode() == insn(0x54, 0x01, 0, -1)


def test_ld_imm64_takes_two_slots() -> None:
    # r1 = 0x1122334455667788: LD | DW | IMM = 0x18, the upper half in the second slot
    first, second = ld_imm64(Reg.R1, 0x1122334455667788)
    assert first.encode() + second.encode() == insn(0x18, 0x01, 0, 0x55667788) + insn(
        0, 0, 0, 0x11223344
    )


def test_map_reference_is_a_pseudo_map_fd_load() -> None:
    # r1 = map fd 3: src_reg BPF_PSEUDO_MAP_FD (1)
    first, second = ld_map_fd(Reg.R1, 3)
    assert first.encode() + second.encode() == insn(0x18, 0x11, 0, 3) + insn(0, 0, 0, 0)


def test_negative_64_bit_immediate() -> None:
    first, second = ld_imm64(Reg.R2, -1)
    assert first.encode() + second.encode() == insn(0x18, 0x02, 0, -1) + insn(0, 0, 0, -1)


def test_jumps_to_labels_are_resolved_relative_to_the_next_instruction() -> None:
    e = Emitter()
    e.jump(Jmp.JEQ, Reg.R0, 0, "out")  # 0
    e.emit(mov64_imm(Reg.R0, 1))  # 1
    e.emit(ld_imm64(Reg.R1, 1 << 40))  # 2, 3
    e.label("out")
    e.emit(exit_insn())  # 4
    code = e.assemble()
    assert code[:8] == insn(0x15, 0x00, 3, 0)
    assert len(code) == 5 * 8


def test_backward_jump() -> None:
    e = Emitter()
    e.label("top")
    e.emit(alu64_imm(Alu.SUB, Reg.R1, 1))  # 0
    e.jump(Jmp.JNE, Reg.R1, 0, "top")  # 1: back to 0 is -2
    e.emit(exit_insn())
    assert e.assemble()[8:16] == insn(0x55, 0x01, -2, 0)


def test_register_operand_jump() -> None:
    e = Emitter()
    e.jump(Jmp.JGT, Reg.R3, Reg.R4, "x")
    e.label("x")
    e.emit(exit_insn())
    assert e.assemble()[:8] == insn(0x2D, 0x43, 0, 0)


def test_unplaced_label_is_an_error() -> None:
    e = Emitter()
    e.goto("nowhere")
    with pytest.raises(BpfError, match="never placed"):
        e.assemble()


def test_label_placed_twice_is_an_error() -> None:
    e = Emitter()
    e.label("x")
    with pytest.raises(BpfError, match="placed twice"):
        e.label("x")


def test_referenced_labels() -> None:
    e = Emitter()
    assert not e.referenced("a")
    e.goto("a")
    assert e.referenced("a")


def test_subprogram_follows_main_and_function_address_counts_from_next_slot() -> None:
    e = Emitter()

    def body(f: Emitter) -> None:
        f.emit(mov64_imm(Reg.R0, 0), exit_insn())

    name = e.subprogram("cb", body)
    e.function_address(Reg.R2, name)  # 0, 1
    e.emit(exit_insn())  # 2
    code = e.assemble()
    # the callback starts at 3: imm = 3 - (0 + 1) = 2, src_reg BPF_PSEUDO_FUNC (4)
    assert code[:8] == insn(0x18, 0x42, 0, 2)
    assert e.functions == [0, 3]
    assert code[24:40] == insn(0xB7, 0, 0, 0) + insn(0x95, 0, 0, 0)
