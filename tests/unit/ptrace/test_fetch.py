"""Fetcharg evaluation with the kernel's semantics, on registers and a fake memory."""

from __future__ import annotations

import struct

import pytest

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace.fetch import FetchContext, ProbeFetcher
from probescope.language.kernel_grammar import parse_kernel_probe
from probescope.language.model import ProbeSpec


class FakeMemory:
    """Readable ranges only; like process_vm_readv, a read stops at the first hole."""

    def __init__(self) -> None:
        self.data: dict[int, int] = {}

    def store(self, address: int, data: bytes) -> None:
        for i, b in enumerate(data):
            self.data[address + i] = b

    def read(self, address: int, size: int) -> bytes:
        out = bytearray()
        for a in range(address, address + size):
            if a not in self.data:
                break
            out.append(self.data[a])
        return bytes(out)

    def read_exact(self, address: int, size: int) -> bytes | None:
        data = self.read(address, size)
        return data if len(data) == size else None

    def read_word(self, address: int) -> int | None:
        data = self.read_exact(address, 8)
        return None if data is None else struct.unpack("<Q", data)[0]

    def read_string(self, address: int, limit: int = 4096) -> tuple[bytes, bool] | None:
        data = self.read(address, limit)
        if not data:
            return None
        end = data.find(b"\0")
        return (data[:end], True) if end >= 0 else (data, False)


def evaluate(
    args: str,
    regs: arch.Registers,
    memory: FakeMemory,
    *,
    kind: str = "p",
    base: int = 0,
    comm: str = "prog",
) -> tuple:
    spec = parse_kernel_probe(f"{kind}:g/e /bin/true:0x10 {args}")
    assert isinstance(spec, ProbeSpec)
    fetcher = ProbeFetcher(spec.args, spec.kind.is_return)
    return fetcher.evaluate(FetchContext(regs, memory, base, lambda: comm))  # type: ignore[arg-type]


@pytest.fixture
def regs() -> arch.Registers:
    r = arch.Registers()
    r.rdi, r.rsi, r.rax, r.rsp, r.rip = 0xFFFF_FFFF_FFFF_FFFE, 0x1000, 0x2000, 0x8000, 0x401000
    r.eflags, r.orig_rax = 0x246, arch.U64
    return r


def test_registers_and_types(regs):
    memory = FakeMemory()
    assert evaluate(
        "a=%di:s8 b=%di:u8 c=%di:x16 d=%di:s64 e=%di f=%ip g=%flags:x32 h=%orig_ax:s32",
        regs,
        memory,
    ) == (-2, 0xFE, 0xFFFE, -2, 0xFFFF_FFFF_FFFF_FFFE, 0x401000, 0x246, -1)


def test_memory_dereference_chain(regs):
    memory = FakeMemory()
    memory.store(0x1000, struct.pack("<Q", 0x3000))
    memory.store(0x3010, struct.pack("<i", -5))
    memory.store(0x8008, struct.pack("<Q", 0x1000))
    assert evaluate("a=+16(+0(%si)):s32 b=+0(+8($stack)):x64 c=$stack1 d=$stack", regs, memory) == (
        -5,
        0x3000,
        0x1000,
        0x8000,
    )


def test_faults_read_as_the_kernel_leaves_them(regs):
    memory = FakeMemory()
    # an intermediate dereference faults: number 0, string fault; $stackN unreadable: 0
    assert evaluate(
        "a=+4(+0(%ax)):u32 b=+0(+0(%ax)):string c=$stack3 d=+0(%ax):u16", regs, memory
    ) == (0, None, 0, 0)


def test_immediates_file_offsets_and_comm(regs):
    memory = FakeMemory()
    memory.store(0x7000 + 0x18, b"\x2a\x00")
    assert evaluate(
        r"a=\123 b=\-1:s16 c=@+0x18:u16 d=$comm e=\"text\":string f=@0x7018:u8",
        regs,
        memory,
        base=0x7000,
    ) == (123, -1, 42, "prog", None, 42)


def test_bitfields(regs):
    memory = FakeMemory()
    memory.store(0x1000, struct.pack("<I", 0b1110110_10001_101))
    assert evaluate(
        "a=+0(%si):b3@0/32 b=+0(%si):b5@3/32 c=+0(%si):b7@8/32 d=+1(%si):b4@0/8", regs, memory
    ) == (5, 17, 0b1110110, 0b0110)


def test_arrays_and_chars(regs):
    memory = FakeMemory()
    memory.store(0x1000, b"hey\0")
    memory.store(0x2000, struct.pack("<QQ", 0x1000, 0x9999))
    assert evaluate(
        "a=+0(%si):u8[3] b=+0(%si):char c=+1(%si):s16[1] d=+0(%ax):string[2]", regs, memory
    ) == ((104, 101, 121), "h", (struct.unpack("<h", b"ey")[0],), ("hey", None))


def test_chars_are_one_character_strings_as_the_tracefs_engine_decodes_them(regs):
    memory = FakeMemory()
    memory.store(0x1000, b"hi\xff\0")
    assert evaluate(
        "a=+0(%si):char[4] b=+2(%si):char n=%di:char bad=+0(%bx):char[2]", regs, memory
    ) == (
        ("h", "i", "\udcff", "\0"),
        "\udcff",
        bytes([regs.rdi & 0xFF]).decode("utf-8", "surrogateescape"),
        ("\0", "\0"),
    )


def test_string_budget_is_one_page_per_hit(regs):
    memory = FakeMemory()
    long = b"x" * 3000 + b"\0"
    memory.store(0x1000, long)
    memory.store(0x2000, long)
    first, second = evaluate("a=+0(%si):string b=+0(%ax):string", regs, memory)
    # args take 8 bytes (two data_loc words) of the page; the strings share the rest
    assert first == "x" * 3000
    assert second == "x" * (4096 - 8 - 3001 - 1)


def test_a_string_longer_than_max_string_size_faults_alone(regs):
    memory = FakeMemory()
    memory.store(0x1000, b"y" * 5000 + b"\0")
    assert evaluate("a=+0(%si):string", regs, memory) == (None,)
    memory.store(0x2000, b"short\0")
    # ...but borrows the room measured for the next string, truncated, leaving it none
    assert evaluate("a=+0(%si):string b=+0(%ax):string", regs, memory) == ("yyyyy", None)


def test_return_probe_retval(regs):
    regs.rax = 0xFFFF_FFFF
    assert evaluate("r=$retval:s32 u=$retval:u32", regs, FakeMemory(), kind="r") == (
        -1,
        0xFFFF_FFFF,
    )
