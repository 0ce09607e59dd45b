"""The one x86_64 register table: every use derived from it says what the three tables it
replaced said (copied below as they stood), and the table agrees with the kernel's ABI."""

from __future__ import annotations

import ctypes

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.language.arch import X86_64, X86_64_REGISTER_ALIASES
from probescope.language.x86_64_registers import (
    ASSEMBLER_NAMES,
    FIELD_BY_NAME,
    FRIENDLY_ALIASES,
    GENERAL_PURPOSE_FIELDS,
    HIGH_BYTE_NAMES,
    KERNEL_NAMES,
    KERNEL_TO_FIELD,
    X86_64_REGISTERS,
)

LEGACY = ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp")
U64, U32 = (1 << 64) - 1, (1 << 32) - 1

# language/arch.py: the kernel's names (regs_query_register_offset) and the friendly aliases.
OLD_ARCH_REGISTERS = frozenset(
    [f"r{n}" for n in range(8, 16)]
    + ["bx", "cx", "dx", "si", "di", "bp", "ax", "orig_ax", "ip", "cs", "flags", "sp", "ss"]
)
OLD_ARCH_ALIASES = {
    **{f"r{r}": r for r in ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip")},
    **{f"e{r}": r for r in ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip")},
    "rflags": "flags",
    "eflags": "flags",
    "pc": "ip",
}

# engines/ptrace/arch_x86_64.py: user_regs_struct, kernel names → fields, handler names, and the
# capstone names an emulated indirect call reads.
OLD_USER_REGS = (
    "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax",
    "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss",
    "fs_base", "gs_base", "ds", "es", "fs", "gs",
)  # fmt: skip
OLD_KERNEL_REGISTERS = {
    "ax": "rax", "bx": "rbx", "cx": "rcx", "dx": "rdx", "si": "rsi", "di": "rdi",
    "bp": "rbp", "sp": "rsp", "r8": "r8", "r9": "r9", "r10": "r10", "r11": "r11",
    "r12": "r12", "r13": "r13", "r14": "r14", "r15": "r15", "ip": "rip",
    "flags": "eflags", "cs": "cs", "ss": "ss", "orig_ax": "orig_rax",
}  # fmt: skip
OLD_REGISTER_ALIASES = {
    **{field: field for field in OLD_KERNEL_REGISTERS.values()},
    **OLD_KERNEL_REGISTERS,
    "eflags": "eflags", "rflags": "eflags", "pc": "rip", "fs_base": "fs_base",
    "gs_base": "gs_base",
}  # fmt: skip
OLD_GPR_FIELDS: dict[str, tuple[str, int]] = {}
for _field in ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp"):
    OLD_GPR_FIELDS[_field] = (_field, U64)
    OLD_GPR_FIELDS["e" + _field[1:]] = (_field, U32)
for _n in range(8, 16):
    OLD_GPR_FIELDS[f"r{_n}"] = (f"r{_n}", U64)
    OLD_GPR_FIELDS[f"r{_n}d"] = (f"r{_n}", U32)


# symbols/usdt_arguments.py: assembler names → (kernel name, size) for SDT operands.
def _old_usdt_table() -> dict[str, tuple[str, int]]:
    table: dict[str, tuple[str, int]] = {}
    for kernel in ("ax", "bx", "cx", "dx"):
        letter = kernel[0]
        table.update({f"r{kernel}": (kernel, 8), f"e{kernel}": (kernel, 4), kernel: (kernel, 2)})
        table[f"{letter}l"] = (kernel, 1)
    for kernel in ("si", "di", "bp", "sp"):
        table.update({f"r{kernel}": (kernel, 8), f"e{kernel}": (kernel, 4), kernel: (kernel, 2)})
        table[f"{kernel}l"] = (kernel, 1)
    for number in range(8, 16):
        kernel = f"r{number}"
        table.update(
            {
                kernel: (kernel, 8),
                f"{kernel}d": (kernel, 4),
                f"{kernel}w": (kernel, 2),
                f"{kernel}b": (kernel, 1),
                f"{kernel}l": (kernel, 1),
            }
        )
    table.update({"rip": ("ip", 8), "eip": ("ip", 4)})
    return table


def test_language_uses_agree_with_the_old_arch_tables() -> None:
    assert KERNEL_NAMES == X86_64.registers == OLD_ARCH_REGISTERS
    assert FRIENDLY_ALIASES == X86_64_REGISTER_ALIASES == OLD_ARCH_ALIASES


def test_ptrace_uses_agree_with_the_old_engine_tables() -> None:
    assert tuple(name for name, _ in arch.Registers._fields_) == OLD_USER_REGS
    assert ctypes.sizeof(arch.Registers) == 27 * 8  # sizeof(struct user_regs_struct)
    assert KERNEL_TO_FIELD == OLD_KERNEL_REGISTERS
    assert GENERAL_PURPOSE_FIELDS == OLD_GPR_FIELDS
    # Handlers may now name every field of user_regs_struct, the selectors ds/es/fs/gs too.
    assert {k: v for k, v in FIELD_BY_NAME.items() if k in OLD_REGISTER_ALIASES} == (
        OLD_REGISTER_ALIASES
    )
    assert set(FIELD_BY_NAME) - set(OLD_REGISTER_ALIASES) == {"ds", "es", "fs", "gs"}
    for name, field in OLD_REGISTER_ALIASES.items():
        assert arch.register_field(name) == arch.register_field(f"%{name}") == field


def test_usdt_use_agrees_with_the_old_sdt_table() -> None:
    assert _old_usdt_table() == ASSEMBLER_NAMES
    assert {"ah", "bh", "ch", "dh"} == HIGH_BYTE_NAMES


def test_the_table_follows_the_abi() -> None:
    fields = [r.field for r in X86_64_REGISTERS]
    assert len(fields) == len(set(fields)) == 27
    general = [r for r in X86_64_REGISTERS if r.is_general_purpose]
    assert len(general) == 16
    for register in general:
        sizes = sorted({size for _, size in register.parts})
        assert sizes == [1, 2, 4, 8], register
        assert register.parts[0] == (register.field, 8)
    for letters in LEGACY:
        (register,) = [r for r in X86_64_REGISTERS if r.kernel == letters]
        assert register.field == f"r{letters}"
        assert dict(register.parts)[f"e{letters}"] == 4 and dict(register.parts)[letters] == 2
    every_name = [name for r in X86_64_REGISTERS for name, _ in r.parts]
    assert len(every_name) == len(set(every_name))
    assert X86_64.arg_registers == ("di", "si", "dx", "cx", "r8", "r9")
    assert set(X86_64.arg_registers) <= KERNEL_NAMES
