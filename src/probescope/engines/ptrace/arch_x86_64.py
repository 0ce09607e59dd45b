"""The x86_64 machine as the ptrace engine drives it: the register set, int3, injected system
calls and jumps. Which instructions can carry a probe and how they run displaced is in
insn_rules_x86_64.py, emulation_x86_64.py and insn_x86_64.py.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Final

from probescope.errors import PtraceError
from probescope.language.x86_64_registers import FIELD_BY_NAME, X86_64_REGISTERS

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
