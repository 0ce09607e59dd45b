"""Per-architecture facts the probe language needs: register names and the function-call ABI."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from probescope.language import x86_64_registers


@dataclass(frozen=True)
class Arch:
    """Register names as `regs_query_register_offset` knows them, and the SysV/AAPCS ABI."""

    name: str
    registers: frozenset[str]
    arg_registers: tuple[str, ...]
    return_register: str
    stack_pointer: str
    instruction_pointer: str
    breakpoint_size: int
    long_size: int = 8
    go_arg_registers: tuple[str, ...] = ()  # Go's register ABI (ABIInternal), in its order

    def arg_register(self, index: int, *, go: bool = False) -> str | None:
        """The register holding the 1-based `index`th integer argument, if it is in a register
        (`go`: the `index`th integer register word of Go's register ABI)."""
        registers = self.go_arg_registers if go else self.arg_registers
        if 1 <= index <= len(registers):
            return registers[index - 1]
        return None


X86_64 = Arch(
    name="x86_64",
    registers=x86_64_registers.KERNEL_NAMES,
    arg_registers=("di", "si", "dx", "cx", "r8", "r9"),
    return_register="ax",
    stack_pointer="sp",
    instruction_pointer="ip",
    breakpoint_size=1,
    go_arg_registers=("ax", "bx", "cx", "di", "si", "r8", "r9", "r10", "r11"),
)

ARM64 = Arch(
    name="aarch64",
    registers=frozenset([f"x{n}" for n in range(31)] + ["lr", "sp", "pc", "pstate"]),
    arg_registers=tuple(f"x{n}" for n in range(8)),
    return_register="x0",
    stack_pointer="sp",
    instruction_pointer="pc",
    breakpoint_size=4,
    go_arg_registers=tuple(f"x{n}" for n in range(16)),
)

ARCHES = {"x86_64": X86_64, "amd64": X86_64, "aarch64": ARM64, "arm64": ARM64}


def host_arch() -> Arch:
    machine = platform.machine()
    return ARCHES.get(machine, X86_64)


# Friendly spellings users bring from assemblers and other tracers, mapped to kernel names.
X86_64_REGISTER_ALIASES = x86_64_registers.FRIENDLY_ALIASES
