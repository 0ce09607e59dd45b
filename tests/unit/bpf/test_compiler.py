"""The compiler from fetch arguments to programs, without a kernel: how arguments are taken
apart, laid out in the record and turned into instructions (which helpers, which offsets), and
which arguments are refused and why. Loading these programs is tested against the live kernel
in tests/integration/bpf."""

from __future__ import annotations

import struct

import pytest

from probescope.engines.bpf.abi import Helper
from probescope.engines.bpf.fetch import FetchProgram
from probescope.engines.bpf.program import (
    ProbeCode,
    RecordAction,
    SharedMaps,
    build_record_program,
)
from probescope.engines.bpf.record import HEADER_SIZE, PAGE_SIZE, layout_for
from probescope.engines.bpf.regs import ARM64_PT_REGS, X86_64_PT_REGS, pt_regs_for
from probescope.engines.bpf.strings import ScratchLayout, SourceKind
from probescope.errors import BpfError
from probescope.language.kernel_grammar import EventsFile, parse_kernel_probe
from probescope.language.model import (
    ArgType,
    Comm,
    FetchArg,
    FileOffset,
    Immediate,
    Memory,
    ProbeSpec,
    Register,
    StackEntry,
)

CALL = 0x85


def args(text: str, *, ret: bool = False) -> tuple[FetchArg, ...]:
    spec = parse_kernel_probe(
        f"{'r' if ret else 'p'}:g/e /bin/true:0x10 {text}", events_file=EventsFile.UPROBE_EVENTS
    )
    assert isinstance(spec, ProbeSpec)
    return spec.args


def instructions(code: bytes) -> list[tuple[int, int, int, int, int]]:
    """(opcode, dst, src, off, imm) of each slot."""
    return [
        (op, regs & 0xF, regs >> 4, off, imm)
        for op, regs, off, imm in struct.iter_unpack("<BBhi", code)
    ]


def helpers(code: bytes) -> list[int]:
    return [imm for op, _, src, _, imm in instructions(code) if op == CALL and src == 0]


MAPS = SharedMaps(ring=3, counters=4, pids=None)


def build(text: str, *, ret: bool = False, sleepable: bool = False, index: int | None = None):  # type: ignore[no-untyped-def]
    code = ProbeCode.of(args(text, ret=ret), ret, 0x1000)
    layout = layout_for(code.args)
    claim = ScratchLayout.plan(layout).value_size if layout.has_strings else 0
    return build_record_program(
        code,
        RecordAction(MAPS, scratch_fd=5, claim_offset=(claim + 7) & ~7),
        X86_64_PT_REGS,
        name="t",
        sleepable=sleepable,
        index=index,
    )


def test_fetch_programs_take_arguments_apart_like_the_kernel() -> None:
    (a, b, c, d, e) = args("+8(+0(%di)) @0x1000 @+0x20 $stack2 \\7")
    assert FetchProgram.of(a.fetch) == FetchProgram(Register("di"), (0, 8))
    assert FetchProgram.of(b.fetch) == FetchProgram(Memory(0x1000), (0,))
    assert FetchProgram.of(c.fetch) == FetchProgram(FileOffset(0x20), (0,))
    assert FetchProgram.of(d.fetch) == FetchProgram(StackEntry(2), ())
    assert FetchProgram.of(e.fetch) == FetchProgram(Immediate(7), ())


def test_record_layout_follows_the_kernels_argument_order_and_sizes() -> None:
    layout = layout_for(args("a=%di:u8 b=+0(%si):string c=+0(%dx):u16[3] d=%cx:b3@4/32"))
    assert [(s.arg.name, s.offset, s.size) for s in layout.slots] == [
        ("a", HEADER_SIZE, 1),
        ("b", HEADER_SIZE + 1, 4),
        ("c", HEADER_SIZE + 5, 6),
        ("d", HEADER_SIZE + 11, 4),
    ]
    assert layout.fixed_size == 15
    assert layout.has_strings
    assert layout.strings_offset == HEADER_SIZE + 15
    assert layout.string_budget == PAGE_SIZE - 15


def test_arguments_larger_than_a_page_are_refused() -> None:
    many = " ".join(f"a{i}=+0(%di):u64[64]" for i in range(9))
    with pytest.raises(BpfError, match="holds at most"):
        layout_for(args(many))


def test_string_sources_user_comm_and_immediate() -> None:
    layout = layout_for(args('a=+0(%di):string b=$comm:string c=\\"x":string d=+0(%si):string[2]'))
    scratch = ScratchLayout.plan(layout)
    kinds = [source.kind for source in scratch.sources]
    assert kinds == [
        SourceKind.USER,
        SourceKind.COMM,
        SourceKind.FAULT,
        SourceKind.USER,
        SourceKind.USER,
    ]
    words = [source.word for source in scratch.sources]
    assert words == [
        HEADER_SIZE,
        HEADER_SIZE + 4,
        HEADER_SIZE + 8,
        HEADER_SIZE + 12,
        HEADER_SIZE + 16,
    ]
    table = scratch.address_table
    assert [s.address_slot for s in scratch.sources if s.kind is SourceKind.USER] == [
        table,
        table + 8,
        table + 16,
    ]
    # the record area leaves room for the worst case the verifier must allow
    assert scratch.record_area >= layout.strings_offset + 2 * layout.string_budget
    assert scratch.value_size % 8 == 0


def test_refusals_say_why() -> None:
    retval = args("x=$retval", ret=True)
    assert "only valid on return probes" in (ProbeCode.of(retval, False, 0).refusal() or "")
    symbol = FetchArg("x", Register("di"), ArgType("symbol", "symbol", 8, False), "%di")
    assert "type symbol" in (ProbeCode.of((symbol,), False, 0).refusal() or "")
    assert ProbeCode.of(retval, True, 0).refusal() is None


def test_comm_needs_a_string_type() -> None:
    arg = FetchArg("c", Comm(), args("x=%di:u32")[0].type, "$comm")
    assert "needs a string type" in (ProbeCode.of((arg,), False, 0).refusal() or "")


def test_probes_with_the_same_code_share_a_program_unless_they_need_their_offset() -> None:
    plain = args("a=%di:s32")
    assert ProbeCode.of(plain, False, 0x10) == ProbeCode.of(plain, False, 0x20)
    relocated = args("a=@+0x40:u32")
    assert ProbeCode.of(relocated, False, 0x10) != ProbeCode.of(relocated, False, 0x20)


def test_reads_of_user_memory_are_what_makes_a_program_sleepable() -> None:
    assert not ProbeCode.of(args("a=%di b=$comm:string"), False, 0).reads_user_memory
    for text in ("+0(%di):u8", "$stack1", "@0x10:u8", "@+8:u8", "+0(%si):string"):
        assert ProbeCode.of(args(text), False, 0).reads_user_memory, text


def test_register_arguments_are_context_loads_and_the_record_is_reserved() -> None:
    image = build("a=%di:u32 b=%si")
    calls = helpers(image.instructions)
    assert Helper.RINGBUF_RESERVE in calls and Helper.RINGBUF_SUBMIT in calls
    assert Helper.PROBE_READ_USER not in calls and Helper.COPY_FROM_USER not in calls
    loads = [
        (dst, off)
        for op, dst, src, off, _ in instructions(image.instructions)
        if op == 0x79 and src == 6
    ]
    di, si = X86_64_PT_REGS.offset("di"), X86_64_PT_REGS.offset("si")
    assert (9, di) in loads and (9, si) in loads
    assert not image.sleepable


def test_dereferences_read_with_the_faulting_helper_when_sleepable() -> None:
    assert Helper.COPY_FROM_USER in helpers(build("+8(+0(%di)):u64", sleepable=True).instructions)
    plain = helpers(build("+8(+0(%di)):u64").instructions)
    assert Helper.PROBE_READ_USER in plain and Helper.COPY_FROM_USER not in plain


def test_strings_go_through_scratch_and_a_dynptr_reservation_stamped_after_it() -> None:
    image = build("s=+0(%di):string")
    calls = helpers(image.instructions)
    assert Helper.RINGBUF_RESERVE_DYNPTR in calls and Helper.RINGBUF_RESERVE not in calls
    assert calls.count(Helper.PROBE_READ_USER_STR) == 2  # measured, then copied
    # the clock is read once, after the reservation: time order across CPUs rests on it
    assert calls.count(Helper.KTIME_GET_NS) == 1
    reserved = calls.index(Helper.RINGBUF_RESERVE_DYNPTR)
    assert reserved < calls.index(Helper.KTIME_GET_NS) < calls.index(Helper.DYNPTR_WRITE)
    assert calls.index(Helper.DYNPTR_WRITE) < calls.index(Helper.RINGBUF_SUBMIT_DYNPTR)
    assert Helper.RINGBUF_DISCARD_DYNPTR in calls  # a failed reservation is released too


def test_records_reserved_in_place_are_stamped_after_the_reservation() -> None:
    calls = helpers(build("a=%di:u32").instructions)
    assert calls.index(Helper.RINGBUF_RESERVE) < calls.index(Helper.KTIME_GET_NS)


def test_return_probes_record_the_function_address() -> None:
    calls = helpers(build("r=%ax", ret=True).instructions)
    assert Helper.GET_FUNC_IP in calls
    assert Helper.GET_FUNC_IP not in helpers(build("r=%ax").instructions)


def test_probe_index_from_the_cookie_or_a_constant() -> None:
    assert Helper.GET_ATTACH_COOKIE in helpers(build("a=%di").instructions)
    assert Helper.GET_ATTACH_COOKIE not in helpers(build("a=%di", index=7).instructions)


def test_register_tables() -> None:
    assert X86_64_PT_REGS.offset("r15") == 0
    assert X86_64_PT_REGS.offset("ip") == 128
    assert X86_64_PT_REGS.offset("sp") == 152
    assert ARM64_PT_REGS.offset("lr") == ARM64_PT_REGS.offset("x30")
    assert ARM64_PT_REGS.offset("pc") == 256
    assert pt_regs_for("aarch64") is ARM64_PT_REGS
    with pytest.raises(BpfError):
        pt_regs_for("riscv64")


def test_the_traced_process_passes_the_pid_filter_on_a_comparison() -> None:
    code = ProbeCode.of(args("a=%di:u32"), False, 0x1000)
    image = build_record_program(
        code,
        RecordAction(SharedMaps(ring=3, counters=4, pids=6, known_pids=(4321,))),
        X86_64_PT_REGS,
        name="t",
    )
    slots = instructions(image.instructions)
    compared = next(i for i, (op, dst, _, _, imm) in enumerate(slots) if op == 0x15 and imm == 4321)
    lookup = next(
        i for i, (op, _, src, _, imm) in enumerate(slots) if op == CALL and imm == 1 and src == 0
    )
    assert compared < lookup  # JEQ r0, 4321 jumps over the map's lookup
    assert compared + slots[compared][3] + 1 > lookup
