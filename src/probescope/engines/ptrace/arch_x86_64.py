"""Everything x86_64 about user-space uprobes: registers, int3, the instructions the kernel
accepts at a probe site, and how each is executed out of line or emulated at the stop.

The rules mirror arch/x86/kernel/uprobes.c (`good_insns_64`, `good_2byte_insns`,
`is_prefix_bad`, `branch_setup_xol_ops`, the riprel scratch-register rewrite and the
FIX_IP/FIX_CALL fixups). What differs is the common path: instead of single-stepping a per-hit
copy, each probe gets a static slot (the instruction relocated, followed by a jump back), and
relative branches are emulated on the registers we already hold at the stop.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import capstone  # type: ignore[import-untyped]
from capstone import x86_const

from probescope.errors import PtraceError
from probescope.language.x86_64_registers import (
    FIELD_BY_NAME,
    GENERAL_PURPOSE_FIELDS,
    X86_64_REGISTERS,
)

NAME: Final = "x86_64"
BREAKPOINT: Final = b"\xcc"
BREAKPOINT_SIZE: Final = 1
SYSCALL_INSTRUCTION: Final = b"\x0f\x05"
SYS_MMAP: Final = 9
SYS_MUNMAP: Final = 11
PROT_READ_EXEC: Final = 0x1 | 0x4
MAP_PRIVATE_ANONYMOUS_FIXED_NOREPLACE: Final = 0x02 | 0x20 | 0x100000
PAGE_SIZE: Final = 4096
SLOT_SIZE: Final = 32
LONG_SIZE: Final = 8
MAX_INSTRUCTION: Final = 15
# A trap at an int3 leaves ip one byte past it (si_code SI_KERNEL).
TRAP_IP_ADVANCE: Final = 1

U64: Final = 0xFFFFFFFFFFFFFFFF


class Registers(ctypes.Structure):
    """`struct user_regs_struct`, the NT_PRSTATUS register set of an x86_64 thread."""

    _fields_ = [(register.field, ctypes.c_uint64) for register in X86_64_REGISTERS]

    def copy(self) -> Registers:
        clone = Registers()
        ctypes.memmove(ctypes.addressof(clone), ctypes.addressof(self), ctypes.sizeof(self))
        return clone

    def assign(self, other: Registers) -> None:
        ctypes.memmove(ctypes.addressof(self), ctypes.addressof(other), ctypes.sizeof(self))


def register_field(name: str) -> str:
    """The user_regs_struct field for a kernel or assembler register name."""
    field = FIELD_BY_NAME.get(name.lstrip("%"))
    if field is None:
        raise PtraceError(
            f"unknown x86_64 register {name!r}",
            hint="use kernel names: ax bx cx dx si di bp sp r8-r15 ip flags cs ss orig_ax",
        )
    return field


def return_value(regs: Registers) -> int:
    return int(regs.rax)


def set_syscall(regs: Registers, address: int, number: int, *args: int) -> None:
    """Make `regs` execute `syscall` at `address` with `number(args)`; orig_rax = -1 keeps the
    kernel's syscall-restart logic from moving ip back when the thread resumes."""
    regs.rip = address
    regs.orig_rax = U64
    regs.rax = number
    for field, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args, strict=False):
        setattr(regs, field, value & U64)


def syscall_result(regs: Registers) -> int:
    value = int(regs.rax)
    return value - (1 << 64) if value >= 1 << 63 else value


def jump_back(source: int, target: int) -> bytes:
    """`jmp target` placed at `source`: rel32 when in range, else `jmp *0(%rip)` + address."""
    rel = target - (source + 5)
    if -(1 << 31) <= rel < 1 << 31:
        return b"\xe9" + struct.pack("<i", rel)
    return absolute_jump(target)


def absolute_jump(target: int) -> bytes:
    return b"\xff\x25\x00\x00\x00\x00" + struct.pack("<Q", target)


class Memory(Protocol):
    """What emulation needs from the tracee: reads that honour protections, stack writes."""

    def read(self, address: int, size: int) -> bytes: ...

    def write_data(self, address: int, data: bytes) -> bool: ...


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
_OF, _CF, _ZF, _SF, _PF = 0x800, 0x1, 0x40, 0x80, 0x4
_CONDITIONS: Final[dict[int, Callable[[int], bool]]] = {
    0x70: lambda f: bool(f & _OF),
    0x72: lambda f: bool(f & _CF),
    0x74: lambda f: bool(f & _ZF),
    0x76: lambda f: bool(f & _CF) or bool(f & _ZF),
    0x78: lambda f: bool(f & _SF),
    0x7A: lambda f: bool(f & _PF),
    0x7C: lambda f: bool(f & _SF) != bool(f & _OF),
    0x7E: lambda f: bool(f & _ZF) or (bool(f & _SF) != bool(f & _OF)),
}


def condition_holds(opcode: int, flags: int) -> bool:
    """Whether jcc `opcode` (0x70..0x7f) is taken under `flags`."""
    taken = _CONDITIONS[opcode & 0xFE](flags)
    return taken if opcode & 1 == 0 else not taken


class UnsupportedInstruction(PtraceError):
    """The probed instruction cannot carry a probe (the kernel refuses it too, or it cannot be
    executed out of line)."""


@dataclass(frozen=True)
class _Encoding:
    prefixes: tuple[int, ...]
    rex: int | None
    rex_offset: int | None
    vex_offset: int | None  # offset of the c4/c5/62 byte
    vex_kind: int | None  # 0xc4, 0xc5, 0x62
    opcode_offset: int
    opcode: tuple[int, ...]  # opcode bytes as the kernel's decoder counts them


def _encoding(code: bytes) -> _Encoding:
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
        return _Encoding(
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
            return _Encoding(
                tuple(prefixes), rex, rex_offset, None, None, i, (0x0F, code[i + 1], code[i + 2])
            )
        return _Encoding(tuple(prefixes), rex, rex_offset, None, None, i, (0x0F, code[i + 1]))
    return _Encoding(
        tuple(prefixes), rex, rex_offset, None, None, i, (code[i],) if i < len(code) else ()
    )


def kernel_refusal(code: bytes) -> str | None:
    """Why arch_uprobe_analyze_insn would refuse this instruction, or None."""
    enc = _encoding(code)
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


# ---------------------------------------------------------------------------------------------
# Decoding with capstone


_DISASSEMBLER = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_DISASSEMBLER.detail = True


def decode(code: bytes, address: int) -> capstone.CsInsn | None:
    for insn in _DISASSEMBLER.disasm(code, address, 1):
        return insn
    return None


def _register_value(regs: Registers, name: str) -> int:
    entry = GENERAL_PURPOSE_FIELDS.get(name)
    if entry is None:
        raise UnsupportedInstruction(f"register {name!r} in an emulated operand")
    field, mask = entry
    return int(getattr(regs, field)) & mask


# ---------------------------------------------------------------------------------------------
# Emulations: applied to the registers held at the stop, no slot, no single-step.


class Emulation:
    """One instruction executed on the stopped thread's registers (and stack)."""

    def apply(self, regs: Registers, memory: Memory) -> bool:
        """Update regs (and memory); False when it cannot (the slot runs it instead)."""
        raise NotImplementedError


class _Skip(Emulation):
    def __init__(self, next_ip: int) -> None:
        self.next_ip = next_ip

    def apply(self, regs: Registers, memory: Memory) -> bool:
        regs.rip = self.next_ip
        return True


class _Jump(Emulation):
    def __init__(self, target: int) -> None:
        self.target = target

    def apply(self, regs: Registers, memory: Memory) -> bool:
        regs.rip = self.target
        return True


class _ConditionalJump(Emulation):
    def __init__(self, opcode: int, target: int, next_ip: int) -> None:
        self.test = _CONDITIONS[opcode & 0xFE]
        self.negate = bool(opcode & 1)
        self.target = target
        self.next_ip = next_ip

    def apply(self, regs: Registers, memory: Memory) -> bool:
        taken = self.test(int(regs.eflags)) != self.negate
        regs.rip = self.target if taken else self.next_ip
        return True


class _Loop(Emulation):
    """loopne/loope/loop/jrcxz (e0..e3); 0x67 makes them count in ecx."""

    def __init__(self, opcode: int, address32: bool, target: int, next_ip: int) -> None:
        self.opcode = opcode
        self.mask = 0xFFFFFFFF if address32 else U64
        self.target = target
        self.next_ip = next_ip

    def apply(self, regs: Registers, memory: Memory) -> bool:
        count = int(regs.rcx) & self.mask
        if self.opcode == 0xE3:
            taken = count == 0
        else:
            count = (count - 1) & self.mask
            regs.rcx = count
            zero = bool(int(regs.eflags) & _ZF)
            taken = count != 0 and (
                self.opcode == 0xE2
                or (self.opcode == 0xE1 and zero)
                or (self.opcode == 0xE0 and not zero)
            )
        regs.rip = self.target if taken else self.next_ip
        return True


class _Call(Emulation):
    def __init__(self, target: int, next_ip: int) -> None:
        self.target = target
        self.return_address = struct.pack("<Q", next_ip)

    def apply(self, regs: Registers, memory: Memory) -> bool:
        sp = (int(regs.rsp) - 8) & U64
        if not memory.write_data(sp, self.return_address):
            return False
        regs.rsp = sp
        regs.rip = self.target
        return True


class _CallIndirect(Emulation):
    """`call *reg` or `call *mem` (ff /2): evaluate the operand at the stop."""

    def __init__(self, insn: capstone.CsInsn, next_ip: int) -> None:
        operand = insn.operands[0]
        self.next_ip = next_ip
        self.return_address = struct.pack("<Q", next_ip)
        self.register: str | None = None
        self.base = self.index = None
        self.scale = 1
        self.disp = 0
        self.segment: str | None = None
        self.rip_relative = False
        if operand.type == x86_const.X86_OP_REG:
            self.register = insn.reg_name(operand.reg)
            if self.register not in GENERAL_PURPOSE_FIELDS:
                raise UnsupportedInstruction(f"indirect call through {self.register}")
            return
        mem = operand.mem
        base = insn.reg_name(mem.base) if mem.base else None
        index = insn.reg_name(mem.index) if mem.index else None
        if base == "rip":
            self.rip_relative = True
        else:
            self.base = base
        self.index = index
        self.scale = mem.scale
        self.disp = mem.disp
        if mem.segment:
            seg = insn.reg_name(mem.segment)
            if seg in ("fs", "gs"):
                self.segment = seg + "_base"

    def target(self, regs: Registers, memory: Memory) -> int | None:
        if self.register is not None:
            return _register_value(regs, self.register)
        address = self.disp
        if self.rip_relative:
            address += self.next_ip
        if self.base:
            address += _register_value(regs, self.base)
        if self.index:
            address += _register_value(regs, self.index) * self.scale
        if self.segment:
            address += int(getattr(regs, self.segment))
        data = memory.read(address & U64, 8)
        if len(data) != 8:
            return None
        return int(struct.unpack("<Q", data)[0])

    def apply(self, regs: Registers, memory: Memory) -> bool:
        target = self.target(regs, memory)
        if target is None:
            return False
        sp = (int(regs.rsp) - 8) & U64
        if not memory.write_data(sp, self.return_address):
            return False
        regs.rsp = sp
        regs.rip = target
        return True


# ---------------------------------------------------------------------------------------------
# The analysed instruction at one probe site


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
                prefix = b"\x67" if 0x67 in _encoding(self.raw).prefixes else b""
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
        first = _encoding(self.raw).opcode[0]
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
        enc = _encoding(self.raw)
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
    enc = _encoding(raw)
    first = enc.opcode[0]
    next_ip = address + insn.size
    kind = "plain"
    branch_opcode = 0
    emulation: Emulation | None = None
    if enc.vex_kind is None and len(enc.opcode) == 1 and first in (0xE9, 0xEB):
        kind = "jump"
        emulation = _Jump(_branch_target(insn))
    elif enc.vex_kind is None and len(enc.opcode) == 1 and 0x70 <= first <= 0x7F:
        kind, branch_opcode = "jcc", first
        emulation = _ConditionalJump(first, _branch_target(insn), next_ip)
    elif (
        enc.vex_kind is None
        and enc.opcode[:1] == (0x0F,)
        and len(enc.opcode) == 2
        and (0x80 <= enc.opcode[1] <= 0x8F)
    ):
        kind, branch_opcode = "jcc", enc.opcode[1] - 0x10
        emulation = _ConditionalJump(branch_opcode, _branch_target(insn), next_ip)
    elif enc.vex_kind is None and len(enc.opcode) == 1 and 0xE0 <= first <= 0xE3:
        kind, branch_opcode = "loop", first
        emulation = _Loop(first, 0x67 in enc.prefixes, _branch_target(insn), next_ip)
    elif enc.vex_kind is None and len(enc.opcode) == 1 and first == 0xE8:
        kind = "call"
        emulation = _Call(_branch_target(insn), next_ip)
    elif enc.vex_kind is None and first == 0xFF and ((insn.modrm >> 3) & 7) in (3, 5):
        kind = "far"
    elif (
        enc.vex_kind is None
        and len(enc.opcode) == 1
        and first == 0xFF
        and ((insn.modrm >> 3) & 7) == 2
    ):
        emulation = _CallIndirect(insn, next_ip)
    elif (
        insn.id == x86_const.X86_INS_NOP
        or insn.id == x86_const.X86_INS_ENDBR64
        or (first == 0x90 and enc.rex is None)
    ):
        emulation = _Skip(next_ip)
    return ProbedInstruction(address, raw, text, emulation, insn, kind, branch_opcode)
