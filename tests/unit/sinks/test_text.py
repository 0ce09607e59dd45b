"""The text sink against the kernel's printers (trace_output.c, trace_uprobe.c, trace_probe.c)."""

from __future__ import annotations

import io

import pytest

from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ArgType, ProbeKind
from probescope.sinks import text
from probescope.sinks.text import TextSink, lat_flags, lost_line
from probescope.traceevent.context import KernelContext, kernel_has_lazy_resched_flag
from probescope.traceevent.kallsyms import KernelSymbols

IRQS_OFF, LAZY, NEED, HARD, SOFT, PREEMPT, NMI, BH_OFF = 1, 2, 4, 8, 16, 32, 64, 128


@pytest.mark.parametrize(
    ("flags", "preempt_count", "expected"),
    [
        (0, 0, "....."),
        (IRQS_OFF, 0, "d...."),
        (IRQS_OFF | BH_OFF, 0, "D...."),
        (BH_OFF, 0, "b...."),
        (NEED, 0, ".n..."),
        (PREEMPT, 0, ".p..."),
        (NEED | PREEMPT, 0, ".N..."),
        (LAZY, 0, ".l..."),
        (LAZY | PREEMPT, 0, ".L..."),
        (NEED | LAZY, 0, ".b..."),
        (NEED | LAZY | PREEMPT, 0, ".B..."),
        (HARD, 0, "..h.."),
        (SOFT, 0, "..s.."),
        (HARD | SOFT, 0, "..H.."),
        (NMI, 0, "..z.."),
        (NMI | HARD, 0, "..Z.."),
        (NMI | SOFT, 0, "..z.."),
        (0, 0x01, "...1."),
        (0, 0x0F, "...f."),
        (0, 0x10, "....1"),
        (0, 0x21, "...12"),
        (IRQS_OFF | NEED | HARD, 0x03, "dnh3."),
        (0xFF, 0xFF, "DBZff"),  # every uprobe record of Linux 6.18.44 looks like this
    ],
)
def test_latency_flags(flags: int, preempt_count: int, expected: str) -> None:
    assert lat_flags(flags, preempt_count) == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [(2, "X...."), (NEED | PREEMPT, ".N..."), (2 | NEED, "Xn..."), (2 | IRQS_OFF, "d....")],
)
def test_latency_flags_before_lazy_preemption(flags: int, expected: str) -> None:
    """Before Linux 6.13 bit 1 was IRQS_NOSUPPORT and there were no lazy variants."""
    assert lat_flags(flags, 0, lazy_resched=False) == expected


def test_kernel_without_irqflags_support_prints_x() -> None:
    assert lat_flags(0, 0, irqflags_support=False) == "X...."
    assert lat_flags(IRQS_OFF, 0, irqflags_support=False) == "d...."


def arg(base: str, size: int, signed: bool = False, count: int = 0) -> ArgType:
    return ArgType(base, base, size, signed, count=count)


ENTRY = EventType(
    "grp",
    "types",
    ProbeKind.UPROBE,
    ("u", "s", "x", "big", "c", "str", "bad", "arr", "harr", "sarr", "carr", "names", "sym"),
    (
        arg("u8", 1),
        arg("s32", 4, True),
        arg("x16", 2),
        arg("u64", 8),
        arg("char", 1),
        arg("string", 4),
        arg("string", 4),
        arg("u8", 1, count=3),
        arg("x8", 1, count=2),
        arg("s8", 1, True, count=2),
        arg("char", 1, count=2),
        arg("string", 4, count=2),
        arg("symbol", 8),
    ),
)
RETURN = EventType("grp", "types_ret", ProbeKind.URETPROBE, ("rv",), (arg("s64", 8, True),))


def entry(**overrides: object) -> Event:
    values = dict(
        timestamp_ns=1354_187408_123,
        cpu=0,
        pid=14796,
        tid=14796,
        comm="ps_capture",
        type=ENTRY,
        ip=0x55EE2C9101F9,
        args=(
            200,
            -1,
            255,
            (1 << 64) - 1,
            "Z",
            "h\udcc3\udca9 %s",
            None,
            (1, 2, 3),
            (1, 255),
            (-1, 2),
            ("a", "\0"),
            ("a", None),
            0xFFFFFFFF81000000,
        ),
        flags=0xFF,
        preempt_count=0xFF,
    )
    values.update(overrides)
    return Event(**values)  # type: ignore[arg-type]


KALLSYMS = """ffffffff81000000 T startup_64
ffffffff81000040 T secondary_startup_64
ffffffff81234500 T vfs_read
ffffffff81234860 T vfs_write
ffffffff81234a00 t ksys_read
ffffffff81234b00 T do_sys_openat2
ffffffff81234c00 T _etext
ffffffff82000000 B _end
ffffffffc0001000 t ext4_sync_fs	[ext4]
ffffffffc0001100 t ext4_other	[ext4]
"""


CONTEXT = KernelContext(symbols=KernelSymbols(io.StringIO(KALLSYMS)))
"""A kernel whose symbols are KALLSYMS, as every sink of these tests is given."""


def sink_of(stream: io.BytesIO | io.StringIO, **options: object) -> TextSink:
    return TextSink(stream, context=CONTEXT, **options)  # type: ignore[arg-type]


def test_kernel_symbols_print_like_percent_ps() -> None:
    table = KernelSymbols(io.StringIO(KALLSYMS))
    assert table.symbol(0xFFFFFFFF81234500) == "vfs_read+0x0/0x360"
    assert table.symbol(0xFFFFFFFF8123451B) == "vfs_read+0x1b/0x360"
    assert table.symbol(0xFFFFFFFF8123451B, offset=False) == "vfs_read"
    assert table.symbol(0xFFFFFFFFC0001004) == "ext4_sync_fs+0x4/0x100 [ext4]"
    assert table.symbol(0x1000) == "0x1000"


def test_kprobe_and_kretprobe_lines() -> None:
    kprobe = EventType(
        "kprobes", "open", ProbeKind.KPROBE, ("dfd",), (ArgType("s32", "s32", 4, True),)
    )
    event = Event(5_000_000, 1, 9, 9, "cat", kprobe, ip=0xFFFFFFFF81234B00, args=(-100,))
    assert render(event).endswith(b"open: (do_sys_openat2+0x0/0x100) dfd=-100\n")
    kret = EventType(
        "kprobes", "rd", ProbeKind.KRETPROBE, ("ret",), (ArgType("s64", "s64", 8, True),)
    )
    event = Event(
        5_000_000, 1, 9, 9, "cat", kret, ip=0xFFFFFFFF81234500, ret_ip=0xFFFFFFFF81234A1B, args=(3,)
    )
    assert render(event).endswith(b"rd: (ksys_read+0x1b/0x100 <- vfs_read) ret=3\n")


def test_function_tracer_line() -> None:
    function = EventType(
        "ftrace",
        "function",
        ProbeKind.FUNCTION,
        ("ip", "parent_ip"),
        (ArgType("x64", "x64", 8, False), ArgType("x64", "x64", 8, False)),
    )
    event = Event(
        5_000_000, 1, 9, 9, "cat", function, args=(0xFFFFFFFF81234500, 0xFFFFFFFF81234A1B)
    )
    assert render(event).endswith(b"     0.005000: vfs_read <-ksys_read\n")


def test_flag_layout_follows_the_kernel_version() -> None:
    assert kernel_has_lazy_resched_flag("6.18.44-fc-v657")
    assert kernel_has_lazy_resched_flag("6.13.0")
    assert not kernel_has_lazy_resched_flag("6.1.0-56-amd64")
    assert not kernel_has_lazy_resched_flag("5.15.0")
    assert KernelContext.for_release("6.18.44-fc-v657").lazy_resched
    assert not KernelContext.for_release("6.1.0-56-amd64").lazy_resched


def render(event: Event, **options: object) -> bytes:
    stream = io.BytesIO()
    sink = sink_of(stream, **options)
    sink.write(event)
    return stream.getvalue()


def test_uprobe_entry_line() -> None:
    assert render(entry()) == (
        b"      ps_capture-14796   [000] DBZff  1354.187408: types: (0x55ee2c9101f9) u=200 s=-1 "
        b"x=0xff big=18446744073709551615 c='Z' str=\"h\xc3\xa9 %s\" bad=(fault) arr={1,2,3} "
        b"harr={0x1,0xff} sarr={-1,2} carr={'a','\x00'} names={\"a\",(fault)} "
        b"sym=startup_64+0x0/0x40\n"
    )


def test_uretprobe_line_prints_return_address_then_function() -> None:
    event = Event(5_000_000, 3, 7, 8, "comm", RETURN, ip=0x1000, ret_ip=0x2000, args=(-7,))
    assert render(event) == (
        b"            comm-8       [003] .....     0.005000: types_ret: (0x2000 <- 0x1000) rv=-7\n"
    )


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        (999_999_499, b"     0.999999: "),
        (999_999_500, b"     1.000000: "),  # ns2usecs rounds to the nearest microsecond
        (123_456_789_012_345, b"123456.789012: "),
        (12_345, b"     0.000012: "),
    ],
)
def test_timestamps_in_microseconds(timestamp: int, expected: bytes) -> None:
    assert expected in render(entry(timestamp_ns=timestamp))


def test_counter_clocks_print_raw_counts() -> None:
    line = render(entry(timestamp_ns=123456789), clock="x86-tsc")
    assert b"[000] DBZff    123456789: types:" in line


def test_tgid_column_and_missing_irq_info() -> None:
    known = render(entry(tid=14797), tgids={14797: 14796})
    assert known.startswith(b"      ps_capture-14797   (  14796) [000] DBZff  1354.187408: ")
    unknown = render(entry(), tgids={})
    assert unknown.startswith(b"      ps_capture-14796   (-------) [000] DBZff ")
    no_flags = render(entry(), irq_info=False)
    assert no_flags.startswith(b"      ps_capture-14796   [000]   1354.187408: ")


def test_long_names_and_ids_widen_the_columns_like_printf() -> None:
    line = render(entry(comm="a-very-long-comm-name", tid=123456789, cpu=1234))
    assert line.startswith(b"a-very-long-comm-name-123456789 [1234] DBZff ")


def test_text_and_binary_streams() -> None:
    stream = io.StringIO()
    sink_of(stream).write(entry(args=(*entry().args[:5], "plain", *entry().args[6:])))
    assert 'str="plain"' in stream.getvalue()
    assert sink_of(io.BytesIO()).binary and not sink_of(io.StringIO()).binary


def test_batches_with_lost_events() -> None:
    stream = io.BytesIO()
    sink = sink_of(stream)
    sink.write_batch(EventBatch([entry(), entry()], lost=12, cpu=1))
    sink.write_batch(EventBatch([], lost=-1, cpu=0))
    lines = stream.getvalue().split(b"\n")
    assert lines[0] == b"CPU:1 [LOST 12 EVENTS]"
    assert lines[1] == lines[2] == render(entry()).rstrip(b"\n")
    assert lines[3] == b"CPU:0 [LOST EVENTS]"
    quiet = io.BytesIO()
    sink_of(quiet, lost_lines=False).write_batch(EventBatch([entry()], lost=3, cpu=0))
    assert quiet.getvalue() == render(entry())
    assert lost_line(None, 4) == "CPU:? [LOST 4 EVENTS]\n"


def test_close_flushes_but_leaves_the_stream_open() -> None:
    stream = io.BytesIO()
    sink = sink_of(stream)
    sink.write(entry())
    sink.close()
    assert not stream.closed and stream.getvalue()


def test_tracepoints_use_the_field_printer() -> None:
    tracepoint = EventType(
        "sched",
        "sched_process_exec",
        ProbeKind.TRACEPOINT,
        ("filename", "pid", "raw"),
        (arg("string", 4), arg("s32", 4, True), ArgType("char x[2]", "bytes", 2, False)),
        system="sched",
    )
    event = Event(1_000, 0, 5, 5, "sh", tracepoint, args=("/bin/true", 5, b"\x01\x02"))
    assert render(event).endswith(b' sched_process_exec: filename="/bin/true" pid=5 raw=0102\n')


def test_printers_are_chosen_by_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    def factory(event_type: EventType, context: KernelContext) -> text.Printer:
        return lambda event: f"custom {event_type.name}"

    monkeypatch.setitem(text.EVENT_PRINTERS, ProbeKind.UPROBE, factory)
    assert render(entry()).endswith(b"1354.187408: custom types\n")


def test_timestamps_moving_between_seconds_in_any_direction() -> None:
    stamps = [2_500_000_000, 1_200_000_400, 1_999_999_600, 3_000_000_000, 0, 2_500_001_000]
    stream = io.BytesIO()
    sink = sink_of(stream)
    for stamp in stamps:
        sink.write(entry(timestamp_ns=stamp))
    times = [line.split(b": ", 1)[0][-13:] for line in stream.getvalue().splitlines()]
    assert times == [
        b"     2.500000",
        b"     1.200000",
        b"     2.000000",
        b"     3.000000",
        b"     0.000000",
        b"     2.500001",
    ]


def test_body_template_alone() -> None:
    body = text.probe_printer(RETURN, CONTEXT).compile("types_ret")
    event = Event(0, 0, 1, 1, "c", RETURN, ip=0x10, ret_ip=0x20, args=(5,))
    assert body(event) == "types_ret: (0x20 <- 0x10) rv=5"
