"""In-kernel aggregation without a kernel: key and value layouts and how user space reads them
back, the min/max words, what is refused and why, and the programs' shape (which helpers,
which maps). Loading and running them is tested in tests/integration/aggregate."""

from __future__ import annotations

import struct

import pytest

from probescope.engines.aggregation import LOG2_BUCKETS, KernelAggregation
from probescope.engines.bpf.abi import BPF_F_USER_STACK, Helper
from probescope.engines.bpf.aggregation_keys import (
    FIELDS_OFFSET,
    MAX_KEY_SIZE,
    KeyLayout,
    ValueLayout,
    as_typed,
    extreme_value,
    extreme_word,
)
from probescope.engines.bpf.aggregation_program import (
    AggregationMaps,
    HitCode,
    KeyCode,
    Loaded,
    build_hit_program,
)
from probescope.engines.bpf.kernel_aggregation import aggregation_refusal
from probescope.engines.bpf.latency_program import (
    DEPTH,
    build_entry_program,
    build_return_program,
    thread_value_size,
)
from probescope.engines.bpf.regs import X86_64_PT_REGS
from probescope.errors import BpfError
from probescope.language.kernel_grammar import EventsFile, parse_kernel_probe
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.language.static_events import TracepointSpec

CALL = 0x85
LD_IMM64 = 0x18


def probe(text: str) -> ResolvedProbe:
    spec = parse_kernel_probe(text, events_file=EventsFile.UPROBE_EVENTS)
    assert isinstance(spec, ProbeSpec)
    kind = ProbeKind.URETPROBE if text.startswith("r") else ProbeKind.UPROBE
    return ResolvedProbe(spec, kind, path="/bin/true", offset=0x10, symbol="f")


def insns(code: bytes) -> list[tuple[int, int, int, int, int]]:
    return [
        (op, regs & 0xF, regs >> 4, off, imm)
        for op, regs, off, imm in struct.iter_unpack("<BBhi", code)
    ]


def helpers(code: bytes) -> list[int]:
    return [imm for op, _, src, _, imm in insns(code) if op == CALL and src == 0]


def maps_referenced(code: bytes) -> set[int]:
    return {imm for op, _, src, _, imm in insns(code) if op == LD_IMM64 and src == 1}


def test_key_parts_sit_at_aligned_offsets_after_probe_and_pid() -> None:
    layout = KeyLayout.of(("probe", "comm", "tid", "x", "ustack", "kstack"))
    assert [(p.name, p.offset, p.size) for p in layout.parts] == [
        ("comm", FIELDS_OFFSET, 16),
        ("tid", FIELDS_OFFSET + 16, 8),
        ("x", FIELDS_OFFSET + 24, 8),
        ("ustack", FIELDS_OFFSET + 32, 16),
        ("kstack", FIELDS_OFFSET + 48, 8),
    ]
    assert layout.size == FIELDS_OFFSET + 56
    assert layout.with_pid  # a user stack needs its process
    assert not KeyLayout.of(("probe", "cpu")).with_pid


def test_keys_read_back_as_the_program_wrote_them() -> None:
    layout = KeyLayout.of(("pid", "comm", "cpu", "x", "ustack", "kstack"))
    key = (
        struct.pack("<II", 3, 1234)
        + b"bash\0\0\0\0\0\0\0\0\0\0\0\0"
        + struct.pack("<IIQqQq", 1, 0, 0xFFFFFFFB, 7, 0x401000, -14)
    )
    assert len(key) == layout.size
    probe_index, pid, parts = layout.read(key)
    assert (probe_index, pid) == (3, 1234)
    assert parts == {
        "comm": "bash",
        "cpu": 1,
        "x": 0xFFFFFFFB,
        "ustack": (7, 0x401000),
        "kstack": -14,
    }
    assert as_typed(0xFFFFFFFB, 4, True) == -5
    assert as_typed(0xFFFFFFFB, 4, False) == 0xFFFFFFFB
    assert as_typed(0xFFFFFFFFFFFFFF80, 1, True) == -128


def test_keys_too_big_for_the_stack_are_refused() -> None:
    fields = tuple(f"a{i}" for i in range(MAX_KEY_SIZE // 8))
    with pytest.raises(BpfError, match="at most"):
        KeyLayout.of(fields)


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("value", [0, 1, 5, -1, -(1 << 63), (1 << 63) - 1, 1 << 40])
def test_min_and_max_words_keep_the_values_order_from_zero(signed: bool, value: int) -> None:
    if not signed and value < 0:
        value &= (1 << 64) - 1
    low, high = (
        extreme_word(value, signed, inverted=True),
        extreme_word(value, signed, inverted=False),
    )
    assert extreme_value(high, signed) == value
    assert extreme_value(low ^ ((1 << 64) - 1), signed) == value
    # a smaller value makes a larger min word, a larger value a larger max word
    smaller = value - 1 if (value > -(1 << 63) if signed else value > 0) else None
    if smaller is not None:
        assert extreme_word(smaller, signed, inverted=True) > low
        assert extreme_word(smaller, signed, inverted=False) < high


def test_values_read_per_cpu_with_min_and_max_of_cpus_that_counted() -> None:
    layout = ValueLayout.of(KernelAggregation("hist", (), of="x"), signed=True)
    assert layout.buckets == LOG2_BUCKETS and layout.size == 8 * (LOG2_BUCKETS + 4)
    buckets = [0] * LOG2_BUCKETS
    buckets[0], buckets[3] = 1, 2
    words = [
        *buckets,
        3,
        (-5 + 2 + 3) & ((1 << 64) - 1),
        extreme_word(-5, True, inverted=True),
        extreme_word(3, True, inverted=False),
    ]
    raw = struct.pack(f"<{len(words)}Q", *words)
    *read_buckets, count, total, low, high = layout.read(raw)
    assert (read_buckets[0], read_buckets[3], count, total, low, high) == (1, 2, 3, 0, -5, 3)
    idle = layout.read(bytes(layout.size))
    assert idle[-4:] == (0, 0, None, None)
    assert ValueLayout.of(KernelAggregation("count", ())).read(struct.pack("<Q", 9)) == (9,)


def test_linear_buckets_include_both_open_ends() -> None:
    aggregation = KernelAggregation("hist", (), of="x", linear=(0, 128, 32))
    assert aggregation.buckets == 6  # below, 4 inside, at or above max


def test_what_cannot_be_aggregated_in_the_kernel() -> None:
    count = KernelAggregation("count", ("probe", "s"))
    assert aggregation_refusal(count, [probe("p:g/e /bin/true:0x10 s=+0(%di):string")]) == (
        "argument s (string) is not a number"
    )
    assert "filter" in (
        aggregation_refusal(count, [probe("p:g/e /bin/true:0x10")], default_filter="a == 1") or ""
    )
    assert "@+OFFSET" in (
        aggregation_refusal(count, [probe("p:g/e /bin/true:0x10 s=@+0x20:u32")]) or ""
    )
    hist = KernelAggregation("hist", (), of="x")
    mixed = [probe("p:g/e /bin/true:0x10 x=%di:s32"), probe("p:g/f /bin/true:0x20 x=%si:u32")]
    assert "signed in one probe" in (aggregation_refusal(hist, mixed) or "")
    tracepoint = ResolvedProbe(TracepointSpec("sched", "sched_switch"), ProbeKind.TRACEPOINT)
    latency = KernelAggregation("latency", ())
    assert aggregation_refusal(latency, [tracepoint]) == "latency of a tracepoint"
    assert aggregation_refusal(count, [probe("p:g/e /bin/true:0x10 s=%di:u32")]) is None
    kernel_stacks = KernelAggregation("count", ("kstack",))
    assert "kernel stacks" in (
        aggregation_refusal(kernel_stacks, [probe("p:g/e /bin/true:0x10")]) or ""
    )
    assert aggregation_refusal(kernel_stacks, [tracepoint]) is None
    wide = KernelAggregation("hist", (), of="x", linear=(0, 100_000, 1))
    assert "buckets" in (aggregation_refusal(wide, []) or "")


MAPS = AggregationMaps(values=(10,), counters=11, template=12, pids=13, user_stacks=14)


def test_a_count_program_keys_by_cookie_and_task_and_adds_atomically() -> None:
    layout = KeyLayout.of(("probe", "tid", "comm", "ustack"))
    code = HitCode(KeyCode(layout, return_address=True))
    image = build_hit_program(
        code,
        KernelAggregation("count", layout_fields(layout)),
        ValueLayout(0),
        MAPS,
        X86_64_PT_REGS,
        name="t",
    )
    called = helpers(image.instructions)
    assert called[0] == Helper.GET_CURRENT_PID_TGID  # the pid filter first
    for helper in (
        Helper.GET_ATTACH_COOKIE,
        Helper.GET_CURRENT_COMM,
        Helper.GET_STACKID,
        Helper.PROBE_READ_USER,  # the return address at [sp]
        Helper.MAP_LOOKUP_ELEM,
        Helper.MAP_UPDATE_ELEM,
    ):
        assert helper in called
    assert maps_referenced(image.instructions) >= {10, 11, 13, 14}
    user_stack_flags = [
        imm for op, dst, _, _, imm in insns(image.instructions) if op == 0xB7 and dst == 3
    ]
    assert BPF_F_USER_STACK in user_stack_flags


def layout_fields(layout: KeyLayout) -> tuple[str, ...]:
    return tuple(p.name for p in layout.parts)


def test_generations_add_the_generation_map_and_in_flight_marks() -> None:
    layout = KeyLayout.of(("probe",))
    maps = AggregationMaps(values=(10, 20), counters=11, generation=15, inflight=16)
    arg = probe("p:g/e /bin/true:0x10 x=%di:s32").spec
    assert isinstance(arg, ProbeSpec)
    code = HitCode(KeyCode(layout), of=Loaded.of_fetch(arg.args[0]))
    aggregation = KernelAggregation("hist", ("probe",), of="x", intervals=True)
    image = build_hit_program(
        code, aggregation, ValueLayout.of(aggregation, True), maps, X86_64_PT_REGS, name="t"
    )
    assert maps_referenced(image.instructions) >= {10, 20, 15, 16}


def test_latency_programs_keep_a_stack_of_calls_per_thread() -> None:
    layout = KeyLayout.of(("probe", "retval"))
    maps = AggregationMaps(values=(10,), counters=11, template=12, threads=17, thread_template=18)
    entry = build_entry_program(KeyCode(layout), maps, X86_64_PT_REGS, name="e")
    aggregation = KernelAggregation("latency", ("probe", "retval"), unit_ns=1000)
    ret = build_return_program(
        KeyCode(layout), aggregation, ValueLayout.of(aggregation), maps, X86_64_PT_REGS, name="r"
    )
    assert Helper.KTIME_GET_NS in helpers(entry.instructions)
    assert Helper.GET_FUNC_IP in helpers(ret.instructions)
    assert {17, 18} <= maps_referenced(entry.instructions)
    assert 17 in maps_referenced(ret.instructions) and 18 not in maps_referenced(ret.instructions)
    assert thread_value_size(layout) == 8 + DEPTH * (24 + layout.size)
