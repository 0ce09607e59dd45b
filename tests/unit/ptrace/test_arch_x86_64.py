"""Instruction analysis for probe sites: the kernel's refusals, the relocated slot code, the
single-step rewrite and the emulations, checked by decoding what we generate."""

from __future__ import annotations

import struct

import pytest

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import insn_rules_x86_64 as rules
from probescope.engines.ptrace import insn_x86_64 as instruction

SITE = 0x5555_5555_1000
SLOT = 0x5555_5554_0000


class FakeMemory:
    """Byte-addressed memory for emulation: reads fault outside what was stored."""

    def __init__(self, contents: dict[int, bytes] | None = None) -> None:
        self.bytes: dict[int, int] = {}
        for address, data in (contents or {}).items():
            self.store(address, data)

    def store(self, address: int, data: bytes) -> None:
        for i, b in enumerate(data):
            self.bytes[address + i] = b

    def read(self, address: int, size: int) -> bytes:
        out = bytearray()
        for a in range(address, address + size):
            if a not in self.bytes:
                break
            out.append(self.bytes[a])
        return bytes(out)

    def write_data(self, address: int, data: bytes) -> bool:
        self.store(address, data)
        return True


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (b"\xcc", "already is int3"),
        (b"\xcd\x80", "not allowed"),  # int 0x80
        (b"\x0f\x05", "not allowed"),  # syscall
        (b"\x0f\x34", "not allowed"),  # sysenter
        (b"\x0f\x0b", "not allowed"),  # ud2
        (b"\xf4", "not allowed"),  # hlt
        (b"\xfa", "not allowed"),  # cli
        (b"\xe4\x60", "not allowed"),  # in al, 0x60
        (b"\x0f\x01\xd0", "not allowed"),  # xgetbv (0f 01 group)
        (b"\xf0\x48\x0f\xb1\x11", "lock prefix"),
        (b"\x26\x8b\x00", "es prefix"),
        (b"\x3e\xff\xe0", "ds prefix"),  # notrack jmp *%rax
        (b"\x66\xe9\x00\x00", "0x66-prefixed branch"),
        (b"\x66\x90", "0x66-prefixed branch"),  # the kernel treats 0x90 as a branch (nop)
        (b"\x66\x0f\x38\x00\xc1", "not allowed"),  # pshufb: 3-byte opcodes are refused
        (b"\xc5\xfe\x6f\x00", "not allowed"),  # vmovdqu: VEX opcode 6f is not in the 1-byte table
    ],
)
def test_the_kernels_refusals(code, reason):
    with pytest.raises(rules.UnsupportedInstruction, match=reason):
        instruction.analyze(code + b"\x90" * 8, SITE)


@pytest.mark.parametrize(
    "code",
    [
        b"\x55",  # push %rbp
        b"\x41\x55",  # push %r13
        b"\x48\x89\xe5",  # mov %rsp,%rbp
        b"\xf3\x0f\x1e\xfa",  # endbr64
        b"\xc5\xf8\x28\xc1",  # vmovaps (VEX 0f 28: allowed by the 1-byte table's 0x28)
        b"\x64\x48\x8b\x04\x25\x28\x00\x00\x00",  # mov %fs:0x28,%rax
        b"\xc3",  # ret
        b"\xe8\x00\x00\x00\x00",  # call
    ],
)
def test_instructions_the_kernel_accepts(code):
    assert rules.kernel_refusal(code) is None
    instruction.analyze(code + b"\x90" * 8, SITE)


def _decode(code: bytes, address: int):
    insn = instruction.decode(code, address)
    assert insn is not None
    return insn


def test_rip_relative_slot_keeps_the_absolute_target():
    code = b"\x48\x8b\x05\x10\x20\x00\x00"  # mov 0x2010(%rip),%rax
    target = SITE + 7 + 0x2010
    insn = instruction.analyze(code + b"\x90" * 8, SITE)
    slot = insn.slot_code(SLOT)
    assert slot is not None
    moved = _decode(slot, SLOT)
    assert moved.size == 7
    assert SLOT + 7 + moved.disp == target
    back = _decode(slot[7:], SLOT + 7)
    assert back.mnemonic == "jmp" and back.operands[0].imm == SITE + 7


def test_rip_relative_out_of_reach_needs_the_step_form():
    code = b"\x48\x89\x3d\x00\x01\x00\x00"  # mov %rdi,0x100(%rip)
    insn = instruction.analyze(code, SITE)
    assert insn.slot_code(SITE + (3 << 31)) is None
    plan = insn.step_plan()
    assert plan.scratch in ("rsi", "rbx")  # not rdi: it is the instruction's register
    step = _decode(plan.code, 0)
    assert step.size == len(code)
    assert step.op_str == f"qword ptr [{plan.scratch} + 0x100], rdi"
    assert plan.fixups == instruction.FIX_IP


def test_step_form_of_an_indirect_call_fixes_the_return_address():
    plan = instruction.analyze(b"\xff\x15\x10\x00\x00\x00", SITE).step_plan()
    assert plan.fixups == instruction.FIX_CALL
    assert plan.scratch == "rsi"
    assert _decode(plan.code, 0).op_str == "qword ptr [rsi + 0x10]"


def test_far_return_keeps_its_ip():
    assert instruction.analyze(b"\xc3", SITE).step_plan().fixups == 0


@pytest.mark.parametrize(
    ("opcode", "flags", "taken"),
    [
        (0x74, 0x40, True),
        (0x75, 0x40, False),  # je / jne with ZF
        (0x72, 0x1, True),
        (0x73, 0x1, False),  # jb / jae with CF
        (0x7C, 0x80, True),
        (0x7C, 0x880, False),  # jl: SF != OF
        (0x7E, 0x0, False),
        (0x7E, 0x40, True),
        (0x7F, 0x0, True),  # jle / jg
        (0x76, 0x1, True),
        (0x77, 0x0, True),  # jbe / ja
        (0x7A, 0x4, True),
        (0x78, 0x80, True),
        (0x70, 0x800, True),  # jp, js, jo
    ],
)
def test_condition_table(opcode, flags, taken):
    assert rules.condition_holds(opcode, flags) is taken


def test_jcc_emulation_and_slot():
    code = b"\x0f\x84\x00\x01\x00\x00"  # je +0x100
    insn = instruction.analyze(code, SITE)
    assert insn.emulation is not None
    regs = arch.Registers()
    regs.eflags = 0x40
    insn.emulation.apply(regs, FakeMemory())
    assert regs.rip == SITE + 6 + 0x100
    regs.eflags = 0
    insn.emulation.apply(regs, FakeMemory())
    assert regs.rip == SITE + 6
    slot = insn.slot_code(SLOT)
    assert slot is not None
    short = _decode(slot, SLOT)
    assert short.mnemonic == "je" and short.operands[0].imm == SLOT + 16
    assert struct.unpack_from("<Q", slot, 2 + 6)[0] == SITE + 6  # fall through
    assert struct.unpack_from("<Q", slot, 16 + 6)[0] == SITE + 6 + 0x100  # taken


def test_loop_emulation_counts_down():
    insn = instruction.analyze(b"\xe2\xfa", SITE)  # loop -6
    regs = arch.Registers()
    regs.rcx = 2
    insn.emulation.apply(regs, FakeMemory())
    assert (regs.rcx, regs.rip) == (1, SITE + 2 - 6)
    insn.emulation.apply(regs, FakeMemory())
    assert (regs.rcx, regs.rip) == (0, SITE + 2)


def test_call_emulation_pushes_the_real_return_address():
    insn = instruction.analyze(b"\xe8\x10\x00\x00\x00", SITE)
    regs = arch.Registers()
    regs.rsp = 0x7FFF_0000
    memory = FakeMemory()
    assert insn.emulation.apply(regs, memory)
    assert regs.rsp == 0x7FFF_0000 - 8
    assert regs.rip == SITE + 5 + 0x10
    assert memory.read(regs.rsp, 8) == struct.pack("<Q", SITE + 5)


def test_indirect_call_through_memory_with_index_and_fs():
    # call *0x8(%rax,%rbx,4)  and  call *%fs:0x10
    insn = instruction.analyze(b"\xff\x54\x98\x08", SITE)
    regs = arch.Registers()
    regs.rax, regs.rbx, regs.rsp = 0x1000, 0x10, 0x7000
    memory = FakeMemory({0x1000 + 0x40 + 8: struct.pack("<Q", 0xDEAD000)})
    assert insn.emulation.apply(regs, memory)
    assert regs.rip == 0xDEAD000
    assert memory.read(0x7000 - 8, 8) == struct.pack("<Q", SITE + 4)
    insn = instruction.analyze(b"\x64\xff\x14\x25\x10\x00\x00\x00", SITE)
    regs.fs_base, regs.rsp = 0x9000, 0x7000
    memory.store(0x9010, struct.pack("<Q", 0xBEEF000))
    assert insn.emulation.apply(regs, memory)
    assert regs.rip == 0xBEEF000


def test_unreadable_indirect_call_target_falls_back_to_the_slot():
    insn = instruction.analyze(b"\xff\x15\x00\x00\x00\x00", SITE)
    regs = arch.Registers()
    regs.rsp = 0x7000
    assert insn.emulation.apply(regs, FakeMemory()) is False
    assert insn.slot_code(SLOT) is not None


def test_nops_and_endbr_are_skipped():
    for code in (b"\x90", b"\x0f\x1f\x44\x00\x00", b"\xf3\x0f\x1e\xfa"):
        insn = instruction.analyze(code + b"\xcc" * 8, SITE)
        regs = arch.Registers()
        insn.emulation.apply(regs, FakeMemory())
        assert regs.rip == SITE + len(code)
    assert instruction.analyze(b"\x41\x90", SITE).emulation is None  # xchg %eax,%r8d


def test_call_slot_returns_to_the_instruction_after_the_call():
    insn = instruction.analyze(b"\xe8\x00\x10\x00\x00", SITE)
    slot = insn.slot_code(SLOT)
    assert slot is not None and len(slot) <= arch.SLOT_SIZE
    call = _decode(slot, SLOT)
    assert call.mnemonic == "call"
    assert struct.unpack_from("<Q", slot, 8)[0] == SITE + 5 + 0x1000
    skip = _decode(slot[6:], SLOT + 6)
    assert skip.mnemonic == "jmp" and skip.operands[0].imm == SLOT + 16
    assert struct.unpack_from("<Q", slot, 16 + 6)[0] == SITE + 5


def test_syscall_setup_blocks_restart():
    regs = arch.Registers()
    regs.orig_rax = 35
    arch.set_syscall(regs, 0x1234, arch.SYS_MMAP, 0x1000, 4096, 5, 0x22, -1, 0)
    assert regs.orig_rax == arch.U64
    assert (regs.rip, regs.rax, regs.rdi, regs.r10, regs.r8) == (0x1234, 9, 0x1000, 0x22, arch.U64)
    regs.rax = (-17) & arch.U64
    assert arch.syscall_result(regs) == -17
