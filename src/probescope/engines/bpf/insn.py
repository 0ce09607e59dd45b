"""BPF instructions: the encoding of `struct bpf_insn` and an emitter with labels.

An instruction is 8 bytes, little-endian: `u8 code`, `u8 dst_reg:4 src_reg:4`, `s16 off`,
`s32 imm` (Documentation/bpf/standardization/instruction-set.rst). `code` is class | size |
mode for loads and stores, class | operation | source for arithmetic and jumps. A 64-bit
immediate load takes two slots. `Emitter` collects instructions, resolves jumps to named labels
when the program is assembled, and refuses a jump that cannot be encoded.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from probescope.engines.bpf.abi import BPF_PSEUDO_FUNC, BPF_PSEUDO_MAP_FD, Helper
from probescope.errors import BpfError


class Reg(IntEnum):
    """r0 return value, r1-r5 arguments (clobbered by calls), r6-r9 callee-saved, r10 frame."""

    R0 = 0
    R1 = 1
    R2 = 2
    R3 = 3
    R4 = 4
    R5 = 5
    R6 = 6
    R7 = 7
    R8 = 8
    R9 = 9
    FP = 10


# Instruction classes
LD = 0x00
LDX = 0x01
ST = 0x02
STX = 0x03
ALU = 0x04
JMP = 0x05
JMP32 = 0x06
ALU64 = 0x07

# Sizes and modes of loads and stores
W = 0x00
H = 0x08
B = 0x10
DW = 0x18
IMM = 0x00
MEM = 0x60
ATOMIC = 0xC0

SIZE_CODES = {1: B, 2: H, 4: W, 8: DW}

# Sources
K = 0x00
X = 0x08


class Alu(IntEnum):
    ADD = 0x00
    SUB = 0x10
    MUL = 0x20
    DIV = 0x30
    OR = 0x40
    AND = 0x50
    LSH = 0x60
    RSH = 0x70
    NEG = 0x80
    MOD = 0x90
    XOR = 0xA0
    MOV = 0xB0
    ARSH = 0xC0


class Jmp(IntEnum):
    JA = 0x00
    JEQ = 0x10
    JGT = 0x20
    JGE = 0x30
    JSET = 0x40
    JNE = 0x50
    JSGT = 0x60
    JSGE = 0x70
    CALL = 0x80
    EXIT = 0x90
    JLT = 0xA0
    JLE = 0xB0
    JSLT = 0xC0
    JSLE = 0xD0


ATOMIC_ADD = 0x00
ATOMIC_FETCH = 0x01
ATOMIC_CMPXCHG = 0xF0 | ATOMIC_FETCH

_INSN = struct.Struct("<BBhi")


@dataclass(frozen=True)
class Insn:
    """One 8-byte instruction slot."""

    code: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0

    def encode(self) -> bytes:
        imm = self.imm
        if imm >= 1 << 31:
            imm -= 1 << 32  # u32 spelled as the s32 field holds it
        return _INSN.pack(self.code, (self.src << 4) | self.dst, self.off, imm)


# -- constructors -------------------------------------------------------------------------------


def alu64_imm(op: Alu, dst: Reg, imm: int) -> Insn:
    return Insn(ALU64 | op | K, dst, 0, 0, imm)


def alu64_reg(op: Alu, dst: Reg, src: Reg) -> Insn:
    return Insn(ALU64 | op | X, dst, src)


def alu32_imm(op: Alu, dst: Reg, imm: int) -> Insn:
    return Insn(ALU | op | K, dst, 0, 0, imm)


def mov64_imm(dst: Reg, imm: int) -> Insn:
    return alu64_imm(Alu.MOV, dst, imm)


def mov64_reg(dst: Reg, src: Reg) -> Insn:
    return alu64_reg(Alu.MOV, dst, src)


def mov32_reg(dst: Reg, src: Reg) -> Insn:
    """dst = (u32)src: the upper half cleared."""
    return Insn(ALU | Alu.MOV | X, dst, src)


def ld_imm64(dst: Reg, value: int, src: int = 0) -> tuple[Insn, Insn]:
    """dst = a 64-bit immediate (two slots); `src` = BPF_PSEUDO_MAP_FD makes it a map."""
    value &= (1 << 64) - 1
    return (
        Insn(LD | DW | IMM, dst, src, 0, value & 0xFFFFFFFF),
        Insn(0, 0, 0, 0, value >> 32),
    )


def ld_map_fd(dst: Reg, map_fd: int) -> tuple[Insn, Insn]:
    return ld_imm64(dst, map_fd, BPF_PSEUDO_MAP_FD)


def ldx(size: int, dst: Reg, src: Reg, off: int) -> Insn:
    """dst = *(uSIZE *)(src + off)"""
    return Insn(LDX | SIZE_CODES[size] | MEM, dst, src, off)


def stx(size: int, dst: Reg, off: int, src: Reg) -> Insn:
    """*(uSIZE *)(dst + off) = src"""
    return Insn(STX | SIZE_CODES[size] | MEM, dst, src, off)


def st_imm(size: int, dst: Reg, off: int, imm: int) -> Insn:
    """*(uSIZE *)(dst + off) = imm"""
    return Insn(ST | SIZE_CODES[size] | MEM, dst, 0, off, imm)


def atomic_add(size: int, dst: Reg, off: int, src: Reg) -> Insn:
    """lock *(uSIZE *)(dst + off) += src (size 4 or 8)"""
    return Insn(STX | SIZE_CODES[size] | ATOMIC, dst, src, off, ATOMIC_ADD)


def atomic_cmpxchg(size: int, dst: Reg, off: int, src: Reg) -> Insn:
    """r0 = cmpxchg((uSIZE *)(dst + off), r0, src): store src if the word equals r0; r0 gets
    the word's old value (size 4 or 8)."""
    return Insn(STX | SIZE_CODES[size] | ATOMIC, dst, src, off, ATOMIC_CMPXCHG)


def jmp_imm(op: Jmp, dst: Reg, imm: int, off: int) -> Insn:
    return Insn(JMP | op | K, dst, 0, off, imm)


def jmp_reg(op: Jmp, dst: Reg, src: Reg, off: int) -> Insn:
    return Insn(JMP | op | X, dst, src, off)


def ja(off: int) -> Insn:
    return Insn(JMP | Jmp.JA, 0, 0, off)


def call(helper: Helper | int) -> Insn:
    return Insn(JMP | Jmp.CALL, 0, 0, 0, int(helper))


def exit_insn() -> Insn:
    return Insn(JMP | Jmp.EXIT)


# -- the emitter --------------------------------------------------------------------------------


@dataclass
class _Fixup:
    index: int
    label: str
    immediate: bool = False  # the target goes in `imm` (a function reference), not `off`


class Emitter:
    """Builds a program: `emit` instructions, `jump` to labels placed with `label`, then
    `assemble` to bytes. Labels are local names; `fresh` makes unique ones."""

    def __init__(self) -> None:
        self.insns: list[Insn] = []
        self._labels: dict[str, int] = {}
        self._fixups: list[_Fixup] = []
        self._serial = 0
        self._subprograms: list[tuple[str, Callable[[Emitter], None]]] = []
        self.functions: list[int] = [0]  # where each function starts, once assembled

    def subprogram(self, stem: str, body: Callable[[Emitter], None]) -> str:
        """A function emitted after the main program (a `bpf_loop` callback): `body` writes
        it, ending in `exit`. Returns its label, for `function_address`."""
        name = self.fresh(stem)
        self._subprograms.append((name, body))
        return name

    def function_address(self, dst: Reg, label: str) -> None:
        """dst = the address of the subprogram at `label` (ld_imm64 with BPF_PSEUDO_FUNC,
        the target counted from the next instruction)."""
        self._fixups.append(_Fixup(len(self.insns), label, immediate=True))
        self.insns.extend(ld_imm64(dst, 0, BPF_PSEUDO_FUNC))

    def __len__(self) -> int:
        return len(self.insns)

    def emit(self, *insns: Insn | tuple[Insn, ...]) -> None:
        for item in insns:
            if isinstance(item, tuple):
                self.insns.extend(item)
            else:
                self.insns.append(item)

    def referenced(self, label: str) -> bool:
        """Some jump emitted so far goes to `label` (code only reachable through it can be
        left out: the verifier refuses unreachable instructions)."""
        return any(fixup.label == label for fixup in self._fixups)

    def fresh(self, stem: str) -> str:
        self._serial += 1
        return f"{stem}.{self._serial}"

    def label(self, name: str) -> None:
        if name in self._labels:
            raise BpfError(f"label {name!r} placed twice")
        self._labels[name] = len(self.insns)

    def jump(self, op: Jmp, dst: Reg, operand: Reg | int, label: str) -> None:
        """`if dst OP operand goto label` (operand a register or an immediate)."""
        self._fixups.append(_Fixup(len(self.insns), label))
        if isinstance(operand, Reg):
            self.insns.append(jmp_reg(op, dst, operand, 0))
        else:
            self.insns.append(jmp_imm(op, dst, operand, 0))

    def goto(self, label: str) -> None:
        self._fixups.append(_Fixup(len(self.insns), label))
        self.insns.append(ja(0))

    def call(self, helper: Helper | int) -> None:
        self.insns.append(call(helper))

    def assemble(self) -> bytes:
        """The program's bytes; subprograms are placed after the main program (which must
        end in `exit`), each only once."""
        while self._subprograms:
            name, body = self._subprograms.pop(0)
            self.label(name)
            self.functions.append(len(self.insns))
            body(self)
        insns = list(self.insns)
        for fixup in self._fixups:
            target = self._labels.get(fixup.label)
            if target is None:
                raise BpfError(f"jump to label {fixup.label!r}, which was never placed")
            off = target - fixup.index - 1
            if fixup.immediate:
                insn = insns[fixup.index]
                insns[fixup.index] = Insn(insn.code, insn.dst, insn.src, insn.off, off)
                continue
            if not -(1 << 15) <= off < 1 << 15:
                raise BpfError(f"jump to {fixup.label!r} spans {off} instructions")
            insn = insns[fixup.index]
            insns[fixup.index] = Insn(insn.code, insn.dst, insn.src, off, insn.imm)
        return b"".join(insn.encode() for insn in insns)
