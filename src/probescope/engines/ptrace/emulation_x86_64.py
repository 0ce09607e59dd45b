"""Displaced x86_64 instructions executed on the stopped thread's registers (and stack): relative
jumps, jcc, loop/jrcxz, calls, indirect calls and nops need no slot and no single-step.
"""

from __future__ import annotations

import struct
from typing import Protocol

import capstone  # type: ignore[import-untyped]
from capstone import x86_const

from probescope.engines.ptrace.arch_x86_64 import U64, Registers
from probescope.engines.ptrace.insn_rules_x86_64 import CONDITIONS, ZF, UnsupportedInstruction
from probescope.language.x86_64_registers import GENERAL_PURPOSE_FIELDS


class Memory(Protocol):
    """What emulation needs from the tracee: reads that honour protections, stack writes."""

    def read(self, address: int, size: int) -> bytes: ...

    def write_data(self, address: int, data: bytes) -> bool: ...


def _register_value(regs: Registers, name: str) -> int:
    entry = GENERAL_PURPOSE_FIELDS.get(name)
    if entry is None:
        raise UnsupportedInstruction(f"register {name!r} in an emulated operand")
    field, mask = entry
    return int(getattr(regs, field)) & mask


class Emulation:
    """One instruction executed on the stopped thread's registers (and stack)."""

    def apply(self, regs: Registers, memory: Memory) -> bool:
        """Update regs (and memory); False when it cannot (the slot runs it instead)."""
        raise NotImplementedError


class Skip(Emulation):
    """nop, endbr64: go on after it."""

    def __init__(self, next_ip: int) -> None:
        self.next_ip = next_ip

    def apply(self, regs: Registers, memory: Memory) -> bool:
        regs.rip = self.next_ip
        return True


class Jump(Emulation):
    """jmp rel8/rel32: go to the target."""

    def __init__(self, target: int) -> None:
        self.target = target

    def apply(self, regs: Registers, memory: Memory) -> bool:
        regs.rip = self.target
        return True


class ConditionalJump(Emulation):
    """jcc rel8/rel32: the target when the condition holds on eflags, else the next one."""

    def __init__(self, opcode: int, target: int, next_ip: int) -> None:
        self.test = CONDITIONS[opcode & 0xFE]
        self.negate = bool(opcode & 1)
        self.target = target
        self.next_ip = next_ip

    def apply(self, regs: Registers, memory: Memory) -> bool:
        taken = self.test(int(regs.eflags)) != self.negate
        regs.rip = self.target if taken else self.next_ip
        return True


class Loop(Emulation):
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
            zero = bool(int(regs.eflags) & ZF)
            taken = count != 0 and (
                self.opcode == 0xE2
                or (self.opcode == 0xE1 and zero)
                or (self.opcode == 0xE0 and not zero)
            )
        regs.rip = self.target if taken else self.next_ip
        return True


class Call(Emulation):
    """call rel32: push the return address, go to the target."""

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


class CallIndirect(Emulation):
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
