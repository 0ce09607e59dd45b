"""Where each register of the probed context sits in `struct pt_regs`, the context a uprobe
program receives, per architecture (arch/x86/include/asm/ptrace.h; arch/arm64's `struct
pt_regs` starts with `struct user_pt_regs`: x0..x30, sp, pc, pstate). Names are the kernel's
fetcharg names (`%di`, `%x0`), as `regs_query_register_offset` knows them."""

from __future__ import annotations

from dataclasses import dataclass

from probescope.errors import BpfError


@dataclass(frozen=True)
class PtRegs:
    """Byte offsets of registers in `struct pt_regs`."""

    arch: str
    offsets: dict[str, int]
    stack_pointer: str
    instruction_pointer: str
    return_value: str

    def offset(self, name: str) -> int:
        try:
            return self.offsets[name]
        except KeyError:
            raise BpfError(f"no register %{name} in {self.arch} pt_regs") from None


_X86_64_ORDER = [
    "r15",
    "r14",
    "r13",
    "r12",
    "bp",
    "bx",
    "r11",
    "r10",
    "r9",
    "r8",
    "ax",
    "cx",
    "dx",
    "si",
    "di",
    "orig_ax",
    "ip",
    "cs",
    "flags",
    "sp",
    "ss",
]

X86_64_PT_REGS = PtRegs(
    arch="x86_64",
    offsets={name: 8 * index for index, name in enumerate(_X86_64_ORDER)},
    stack_pointer="sp",
    instruction_pointer="ip",
    return_value="ax",
)

ARM64_PT_REGS = PtRegs(
    arch="aarch64",
    offsets={
        **{f"x{n}": 8 * n for n in range(31)},
        "lr": 8 * 30,
        "sp": 8 * 31,
        "pc": 8 * 32,
        "pstate": 8 * 33,
    },
    stack_pointer="sp",
    instruction_pointer="pc",
    return_value="x0",
)

PT_REGS = {"x86_64": X86_64_PT_REGS, "aarch64": ARM64_PT_REGS}


def pt_regs_for(arch: str) -> PtRegs:
    try:
        return PT_REGS[arch]
    except KeyError:
        raise BpfError(
            f"the bpf engine knows the pt_regs layout of x86_64 and aarch64, not {arch}"
        ) from None
