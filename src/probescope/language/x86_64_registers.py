"""The x86_64 registers, once: each with its kernel name, its user_regs_struct field and its
assembler spellings, from which every register table of probescope is derived.

The kernel names registers in fetchargs as `regs_query_register_offset` does
(arch/x86/kernel/ptrace.c `regoffset_table`: `ax`, `r8`, `ip`, `flags`, `orig_ax`...); ptrace
reads and writes them as the fields of `struct user_regs_struct` (asm/user_64.h: `rax`, `rip`,
`eflags`, `fs_base`...), in the order listed here; assemblers and SDT notes spell a register or
its low bytes `%rax`/`%eax`/`%ax`/`%al`, `%r8`/`%r8d`/`%r8w`/`%r8b`. Users bring other names
still (`rflags`, `pc`).
"""

from __future__ import annotations

from typing import NamedTuple


class X86Register(NamedTuple):
    """One field of `struct user_regs_struct`.

    `kernel` is its fetcharg name (None when the kernel names no such pt_regs offset: the TLS
    bases and data-segment selectors). `parts` are the assembler names of the register and of
    its low bits, each with its size in bytes. `high_byte` is the bits 8-15 alias of the four
    legacy registers that have one (`ah`). `other_names` are further names of the whole
    register that users bring from other tools.
    """

    field: str
    kernel: str | None = None
    parts: tuple[tuple[str, int], ...] = ()
    high_byte: str | None = None
    other_names: tuple[str, ...] = ()

    @property
    def is_general_purpose(self) -> bool:
        """One of the sixteen integer registers: the ones with a one-byte part."""
        return any(size == 1 for _, size in self.parts)


def _legacy(letters: str, byte: str, high_byte: str | None = None) -> X86Register:
    """rax/eax/ax/al-style names of a register the kernel calls `letters` (ax, si...)."""
    parts = ((f"r{letters}", 8), (f"e{letters}", 4), (letters, 2), (byte, 1))
    return X86Register(f"r{letters}", letters, parts, high_byte)


def _numbered(number: int) -> X86Register:
    """r8/r8d/r8w/r8b (and AMD's r8l) of one of the registers added by x86_64."""
    name = f"r{number}"
    parts = ((name, 8), (f"{name}d", 4), (f"{name}w", 2), (f"{name}b", 1), (f"{name}l", 1))
    return X86Register(name, name, parts)


# In the order of struct user_regs_struct (the NT_PRSTATUS register set).
X86_64_REGISTERS: tuple[X86Register, ...] = (
    _numbered(15),
    _numbered(14),
    _numbered(13),
    _numbered(12),
    _legacy("bp", "bpl"),
    _legacy("bx", "bl", "bh"),
    _numbered(11),
    _numbered(10),
    _numbered(9),
    _numbered(8),
    _legacy("ax", "al", "ah"),
    _legacy("cx", "cl", "ch"),
    _legacy("dx", "dl", "dh"),
    _legacy("si", "sil"),
    _legacy("di", "dil"),
    X86Register("orig_rax", "orig_ax"),
    X86Register("rip", "ip", (("rip", 8), ("eip", 4)), other_names=("pc",)),
    X86Register("cs", "cs"),
    X86Register("eflags", "flags", other_names=("rflags", "eflags")),
    _legacy("sp", "spl"),
    X86Register("ss", "ss"),
    X86Register("fs_base"),
    X86Register("gs_base"),
    X86Register("ds"),
    X86Register("es"),
    X86Register("fs"),
    X86Register("gs"),
)

KERNEL_NAMES: frozenset[str] = frozenset(r.kernel for r in X86_64_REGISTERS if r.kernel)

# Spellings with a size prefix (`rax`, `eax`, `rip`) and other tools' names (`rflags`, `pc`)
# of the registers the kernel names without one — the "write %ax" hint of the probe language.
FRIENDLY_ALIASES: dict[str, str] = {
    **{
        name: r.kernel
        for r in X86_64_REGISTERS
        if r.kernel
        for name, size in r.parts
        if size in (8, 4) and name[0] in "re" and name[1:] == r.kernel
    },
    **{name: r.kernel for r in X86_64_REGISTERS if r.kernel for name in r.other_names},
}

# Kernel name → user_regs_struct field: what a fetcharg's `%ax` reads under ptrace.
KERNEL_TO_FIELD: dict[str, str] = {r.kernel: r.field for r in X86_64_REGISTERS if r.kernel}

# Every name a ptrace handler may use for a register: field, kernel name or other name.
FIELD_BY_NAME: dict[str, str] = {
    **{r.field: r.field for r in X86_64_REGISTERS},
    **KERNEL_TO_FIELD,
    **{name: r.field for r in X86_64_REGISTERS for name in r.other_names},
}

# Assembler name → (kernel name, size in bytes) of the integer registers and %rip/%eip: the
# operands of SDT notes.
ASSEMBLER_NAMES: dict[str, tuple[str, int]] = {
    name: (r.kernel, size) for r in X86_64_REGISTERS if r.kernel for name, size in r.parts
}

HIGH_BYTE_NAMES: frozenset[str] = frozenset(r.high_byte for r in X86_64_REGISTERS if r.high_byte)

# Capstone's names of the 64- and 32-bit general-purpose registers → (field, value mask): the
# operands an emulated indirect call may read.
GENERAL_PURPOSE_FIELDS: dict[str, tuple[str, int]] = {
    name: (r.field, (1 << 8 * size) - 1)
    for r in X86_64_REGISTERS
    if r.is_general_purpose
    for name, size in r.parts
    if size in (8, 4)
}
