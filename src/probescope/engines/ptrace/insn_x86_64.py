"""The instruction under a breakpoint: decoded (capstone), checked against the kernel's rules,
and planned for out-of-line execution — a static slot (the instruction relocated, followed by a
jump back), an emulation at the stop, or the kernel's single-step copy.

The plans mirror arch/x86/kernel/uprobes.c (`branch_setup_xol_ops`, the riprel scratch-register
rewrite and the FIX_IP/FIX_CALL fixups). What differs is the common path: instead of
single-stepping a per-hit copy, each probe gets a static slot, and relative branches are
emulated on the registers already held at the stop.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import capstone  # type: ignore[import-untyped]
from capstone import x86_const

from probescope.engines.ptrace.arch_x86_64 import (
    BREAKPOINT,
    MAX_INSTRUCTION,
    U64,
    absolute_jump,
    jump_back,
)
from probescope.engines.ptrace.emulation_x86_64 import (
    Call,
    CallIndirect,
    ConditionalJump,
    Emulation,
    Jump,
    Loop,
    Skip,
)
from probescope.engines.ptrace.insn_rules_x86_64 import (
    UnsupportedInstruction,
    encoding,
    kernel_refusal,
)

_DISASSEMBLER = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_DISASSEMBLER.detail = True


def decode(code: bytes, address: int) -> capstone.CsInsn | None:
    for insn in _DISASSEMBLER.disasm(code, address, 1):
        return insn
    return None


FIX_IP: Final = 0x1
FIX_CALL: Final = 0x2


@dataclass(frozen=True)
class StepPlan:
    """A copy to single-step in a slot, kernel style: the bytes, the scratch register standing
    in for %rip (if any) and the fixups to apply after the step."""

    code: bytes
    scratch: str | None
    fixups: int


@dataclass
class ProbedInstruction:
    """The original instruction under a breakpoint and the ways to run it displaced."""

    address: int
    raw: bytes
    text: str
    emulation: Emulation | None
    _insn: capstone.CsInsn
    _kind: str  # plain, jump, jcc, loop, call, far
    _branch_opcode: int = 0  # jcc: the short form 0x70..0x7f; loop: 0xe0..0xe3

    @property
    def length(self) -> int:
        return len(self.raw)

    @property
    def next_ip(self) -> int:
        return self.address + len(self.raw)

    @property
    def rip_relative(self) -> bool:
        return self._insn.disp_size == 4 and _mem_base_is_rip(self._insn)

    def slot_code(self, slot: int) -> bytes | None:
        """Relocated instruction + jump back for a static slot at `slot`; None when it cannot be
        relocated there (RIP-relative displacement out of range, far branches)."""
        insn = self._insn
        kind = self._kind
        next_ip = self.next_ip
        if kind == "far":
            return None
        if kind == "jump":
            return absolute_jump(_branch_target(insn))
        if kind in ("jcc", "loop"):
            target = _branch_target(insn)
            if kind == "jcc":
                short = bytes([self._branch_opcode, 14])
            else:
                prefix = b"\x67" if 0x67 in encoding(self.raw).prefixes else b""
                short = prefix + bytes([self._branch_opcode, 14])
            fallthrough = absolute_jump(next_ip)
            return short + fallthrough + absolute_jump(target)
        if kind == "call":
            target = _branch_target(insn)
            return (
                b"\xff\x15\x02\x00\x00\x00"
                + b"\xeb\x08"
                + struct.pack("<Q", target)
                + absolute_jump(next_ip)
            )
        code = bytearray(self.raw)
        if self.rip_relative:
            disp = insn.disp + (self.address - slot)
            if not -(1 << 31) <= disp < 1 << 31:
                return None
            struct.pack_into("<i", code, insn.disp_offset, disp)
        tail = slot + len(code)
        return bytes(code) + jump_back(tail, next_ip)

    def step_plan(self) -> StepPlan:
        """The kernel's single-step form: RIP-relative operands rewritten to go through a
        scratch register holding next_ip; FIX_IP/FIX_CALL as arch_uprobe_analyze_insn sets."""
        insn = self._insn
        first = encoding(self.raw).opcode[0]
        fixups = FIX_IP
        if first in (0xC3, 0xCB, 0xC2, 0xCA, 0xEA):
            fixups = 0
        elif first == 0x9A:
            fixups = FIX_CALL
        elif first == 0xFF:
            reg = (insn.modrm >> 3) & 7
            if reg in (2, 3):
                fixups = FIX_CALL
            elif reg in (4, 5):
                fixups = 0
        if not self.rip_relative:
            return StepPlan(self.raw, None, fixups)
        code = bytearray(self.raw)
        enc = encoding(self.raw)
        reg_field = (insn.modrm >> 3) & 7
        if enc.rex is not None and enc.rex & 0x4:
            reg_field |= 8
        vvvv = None
        if enc.vex_kind == 0xC5 and enc.vex_offset is not None:
            vvvv = (~self.raw[enc.vex_offset + 1] >> 3) & 0xF
        elif enc.vex_kind == 0xC4 and enc.vex_offset is not None:
            vvvv = (~self.raw[enc.vex_offset + 2] >> 3) & 0xF
        elif enc.vex_kind == 0x62:
            raise UnsupportedInstruction(
                f"EVEX RIP-relative instruction {self.text!r} cannot be single-stepped out of line"
            )
        used = {reg_field, vvvv}
        scratch_number = next(n for n in (6, 7, 3) if n not in used)  # si, di, bx
        scratch = {6: "rsi", 7: "rdi", 3: "rbx"}[scratch_number]
        modrm_offset = insn.modrm_offset
        code[modrm_offset] = 0x80 | (insn.modrm & 0x38) | scratch_number
        if enc.rex_offset is not None:
            code[enc.rex_offset] &= 0xFE
        if enc.vex_kind == 0xC4 and enc.vex_offset is not None:
            code[enc.vex_offset + 1] |= 0x20
        return StepPlan(bytes(code), scratch, fixups)


def _mem_base_is_rip(insn: capstone.CsInsn) -> bool:
    for op in insn.operands:
        if op.type == x86_const.X86_OP_MEM and op.mem.base == x86_const.X86_REG_RIP:
            return True
    return False


def _branch_target(insn: capstone.CsInsn) -> int:
    return int(insn.operands[0].imm) & U64


def analyze(code: bytes, address: int) -> ProbedInstruction:
    """Decode the instruction at a probe site and choose how it runs out of line.

    Raises UnsupportedInstruction naming the instruction when the kernel would refuse it.
    """
    if code[:1] == BREAKPOINT:
        raise UnsupportedInstruction(
            f"the byte at 0x{address:x} already is int3 (0xcc)",
            hint="another debugger or a kernel uprobe holds this address, or the program "
            "itself contains int3 here",
        )
    insn = decode(code, address)
    if insn is None:
        raise UnsupportedInstruction(
            f"cannot decode an instruction at 0x{address:x} (bytes {code[:MAX_INSTRUCTION].hex()})"
        )
    raw = bytes(code[: insn.size])
    text = f"{insn.mnemonic} {insn.op_str}".strip()
    refusal = kernel_refusal(raw)
    if refusal:
        raise UnsupportedInstruction(
            f"cannot probe '{text}' at 0x{address:x}: {refusal} (the kernel refuses it too)"
        )
    enc = encoding(raw)
    first = enc.opcode[0]
    next_ip = address + insn.size
    kind = "plain"
    branch_opcode = 0
    emulation: Emulation | None = None
    if enc.vex_kind is None and len(enc.opcode) == 1 and first in (0xE9, 0xEB):
        kind = "jump"
        emulation = Jump(_branch_target(insn))
    elif enc.vex_kind is None and len(enc.opcode) == 1 and 0x70 <= first <= 0x7F:
        kind, branch_opcode = "jcc", first
        emulation = ConditionalJump(first, _branch_target(insn), next_ip)
    elif (
        enc.vex_kind is None
        and enc.opcode[:1] == (0x0F,)
        and len(enc.opcode) == 2
        and (0x80 <= enc.opcode[1] <= 0x8F)
    ):
        kind, branch_opcode = "jcc", enc.opcode[1] - 0x10
        emulation = ConditionalJump(branch_opcode, _branch_target(insn), next_ip)
    elif enc.vex_kind is None and len(enc.opcode) == 1 and 0xE0 <= first <= 0xE3:
        kind, branch_opcode = "loop", first
        emulation = Loop(first, 0x67 in enc.prefixes, _branch_target(insn), next_ip)
    elif enc.vex_kind is None and len(enc.opcode) == 1 and first == 0xE8:
        kind = "call"
        emulation = Call(_branch_target(insn), next_ip)
    elif enc.vex_kind is None and first == 0xFF and ((insn.modrm >> 3) & 7) in (3, 5):
        kind = "far"
    elif (
        enc.vex_kind is None
        and len(enc.opcode) == 1
        and first == 0xFF
        and ((insn.modrm >> 3) & 7) == 2
    ):
        emulation = CallIndirect(insn, next_ip)
    elif (
        insn.id == x86_const.X86_INS_NOP
        or insn.id == x86_const.X86_INS_ENDBR64
        or (first == 0x90 and enc.rex is None)
    ):
        emulation = Skip(next_ip)
    return ProbedInstruction(address, raw, text, emulation, insn, kind, branch_opcode)
