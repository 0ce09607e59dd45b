"""The dead man's switch: its checked-in image is what dead_mans_switch.S assembles to, and the
tables the tracer keeps for it (the registers a lent thread resumes with, the hijacked
returns) hold what the handler will need."""

from __future__ import annotations

import importlib.util
import shutil
import struct
from pathlib import Path

import pytest

from probescope.engines.ptrace import arch_x86_64 as arch
from probescope.engines.ptrace import dead_mans_switch
from probescope.engines.ptrace.dead_mans_switch import DeadMansSwitch
from probescope.engines.ptrace.dead_mans_switch_code import CONSTANTS, IMAGE, LABELS

TOOL = Path(__file__).resolve().parents[3] / "tools" / "ptrace_switch_code.py"
BASE = 0x300000000000


class RecordedWrites:
    """Stands in for TraceeMemory: keeps what is written where, reads it back."""

    def __init__(self) -> None:
        self.pid = 1
        self.bytes: dict[int, int] = {}

    def write_code(self, address: int, data: bytes, tid: int | None = None) -> None:
        for i, byte in enumerate(data):
            self.bytes[address + i] = byte

    def read(self, address: int, size: int) -> bytes:
        return bytes(self.bytes.get(address + i, 0) for i in range(size))

    def u64(self, address: int) -> int:
        return int(struct.unpack("<Q", self.read(address, 8))[0])


@pytest.mark.skipif(shutil.which("as") is None, reason="binutils `as` is not installed")
def test_the_image_is_what_the_source_assembles_to():
    spec = importlib.util.spec_from_file_location("ptrace_switch_code", TOOL)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    generated = tool.generate()
    assert generated == (TOOL.parents[1] / "src" / "probescope" / "engines" / "ptrace" /
                         "dead_mans_switch_code.py").read_text()  # fmt: skip


def test_layout_fits_the_engine():
    assert IMAGE[: len(dead_mans_switch.MAGIC)] == dead_mans_switch.MAGIC
    assert LABELS["image_end"] == len(IMAGE) <= CONSTANTS["SITES_OFFSET"]
    assert CONSTANTS["TRAMPOLINE_SIZE"] == arch.SLOT_SIZE
    assert CONSTANTS["SAVED_GREGS"] == 18
    assert LABELS["saved_gregs"] == LABELS["injection_resume"] + 8  # written in one go
    assert CONSTANTS["AREA_SIZE"] % arch.PAGE_SIZE == 0


def _lent(regs: arch.Registers) -> tuple[int, list[int]]:
    memory = RecordedWrites()
    DeadMansSwitch(BASE, frozenset()).lend(memory, 1, 0x7000, regs)  # type: ignore[arg-type]
    start = BASE + LABELS["injection_resume"]
    values = [memory.u64(start + 8 * i) for i in range(19)]
    return values[0], values[1:]


def test_a_lent_thread_resumes_as_its_tracer_would_have_resumed_it():
    regs = arch.Registers()
    regs.r8, regs.rdi, regs.rsp, regs.rip, regs.eflags = 8, 0xD1, 0x7FFC0000, 0x401000, 0x246
    regs.orig_rax = arch.U64  # not in a system call
    regs.rax = 42
    resume, gregs = _lent(regs)
    assert resume == 0x7000
    # mcontext_t order: r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, eflags
    assert gregs[0] == 8 and gregs[8] == 0xD1 and gregs[13] == 42
    assert gregs[15:18] == [0x7FFC0000, 0x401000, 0x246]


@pytest.mark.parametrize(
    ("error", "rax", "rewound"),
    [
        (-512, 35, True),  # ERESTARTSYS: the call again
        (-513, 35, True),  # ERESTARTNOINTR
        (-514, 35, True),  # ERESTARTNOHAND
        (-516, 219, True),  # ERESTART_RESTARTBLOCK: restart_syscall
        (-4, -4 & arch.U64, False),  # EINTR: returned as it is
    ],
)
def test_a_thread_lent_from_inside_a_system_call_restarts_it(error, rax, rewound):
    regs = arch.Registers()
    regs.orig_rax = 35  # nanosleep, interrupted by our stop
    regs.rax = error & arch.U64
    regs.rip = 0x401002
    _, gregs = _lent(regs)
    assert gregs[13] == rax
    assert gregs[16] == (0x401000 if rewound else 0x401002)


def test_sites_are_recorded_and_forgotten_without_holes():
    memory = RecordedWrites()
    switch = DeadMansSwitch(BASE, frozenset())
    for n, address in enumerate((0x1000, 0x2000, 0x3000)):
        switch.add_site(memory, 1, address, 0x9000 + n, bytes([0x55 + n]) * (n + 1))  # type: ignore[arg-type]
    assert memory.u64(BASE + LABELS["site_count"]) == 3
    switch.remove_site(memory, 1, 0x1000)  # type: ignore[arg-type]
    assert memory.u64(BASE + LABELS["site_count"]) == 2
    sites = BASE + CONSTANTS["SITES_OFFSET"]
    entry = memory.read(sites, 32)
    assert struct.unpack_from("<QQ", entry) == (0x3000, 0x9002)  # the last one moved up
    assert entry[16:19] == b"\x57\x57\x57" and entry[31] == 3
    assert switch.sites == {0x3000: 0, 0x2000: 1}


def test_returns_are_recorded_once_per_slot_and_full_tables_reuse_dead_slots(monkeypatch):
    monkeypatch.setattr(dead_mans_switch, "RETURN_CAPACITY", 2)
    memory = RecordedWrites()
    switch = DeadMansSwitch(BASE, frozenset())
    returns = BASE + CONSTANTS["RETURNS_OFFSET"]

    def record(stack: int, original: int, live: set[int]) -> bool:
        return switch.record_return(memory, 1, stack, original, lambda: live)  # type: ignore[arg-type]

    assert record(0x7F00, 0x401111, set())
    assert record(0x7F00, 0x401111, set())  # same slot, same caller: nothing to write
    assert record(0x7E00, 0x402222, set())
    assert not record(0x7D00, 0x403333, {0x7F00, 0x7E00})  # both pending: no room
    assert record(0x7D00, 0x403333, {0x7E00})
    assert struct.unpack("<QQ", memory.read(returns, 16)) == (0x7D00, 0x403333)
    assert struct.unpack("<QQ", memory.read(returns + 16, 16)) == (0x7E00, 0x402222)
