"""Compile-time refusals, kernel symbols and types, and the text sink wiring."""

from __future__ import annotations

import dataclasses
import io
import re
import struct

import pytest

from probescope.errors import RingBufferFormatError
from probescope.events import EventType
from probescope.language.model import ArgType, ProbeKind
from probescope.sinks.text import TextSink
from probescope.traceevent.btf import KernelTypes
from probescope.traceevent.context import KernelContext
from probescope.traceevent.format import EventFormat
from probescope.traceevent.kallsyms import KernelSymbols
from probescope.traceevent.print_fmt import (
    NOT_REPRODUCED,
    PrintFmtError,
    compile_print_fmt,
    tracepoint_printer,
)
from probescope.traceevent.printk_formats import parse_printk_formats
from unit.print_fmt.support import event, event_format, event_type, render

KALLSYMS = """\
ffffffff81000000 T srso_alias
ffffffff81000000 T _stext
ffffffff81000100 T foo
ffffffff81000100 t foo_alias
ffffffff81000180 T bar
ffffffff81000200 T _etext
ffffffff82000000 T _sinittext
ffffffff82000010 T init_fn
ffffffff82000100 T _einittext
ffffffffc0000000 t mod_fn\t[mymod]
ffffffffc0000040 t mod_fn2\t[mymod]
"""


def symbols() -> KernelSymbols:
    return KernelSymbols(io.StringIO(KALLSYMS))


@pytest.mark.parametrize(
    ("conversion", "address", "expected"),
    [
        ("%pS", 0xFFFFFFFF81000110, "foo+0x10/0x80"),
        ("%ps", 0xFFFFFFFF81000110, "foo"),
        ("%pS", 0xFFFFFFFF81000100, "foo+0x0/0x80"),
        ("%pB", 0xFFFFFFFF81000180, "foo+0x80/0x80"),
        ("%pS", 0xFFFFFFFF81000190, "bar+0x10/0x80"),
        ("%ps", 0xFFFFFFFF81000004, "srso_alias"),
        ("%pS", 0xFFFFFFFF81000200, "0xffffffff81000200"),
        ("%pS", 0xFFFFFFFF82000030, "init_fn+0x20/0xf0"),
        ("%pS", 0xFFFFFFFFC0000010, "mod_fn+0x10/0x40 [mymod]"),
        ("%ps", 0xFFFFFFFFC0000010, "mod_fn [mymod]"),
        ("%pS", 0xFFFFFFFFC0000050, "0xffffffffc0000050"),
        ("%pS", 0, "0x0"),
        ("%pS", 0x7F0012345678, "0x7f0012345678"),
        ("%-20ps|", 0xFFFFFFFF81000110, "foo                 |"),
    ],
)
def test_symbols(conversion: str, address: int, expected: str) -> None:
    context = KernelContext(symbols=symbols())
    fmt = f'"{conversion}", (void *)REC->ip'
    assert render(["unsigned long ip;8;0"], fmt, address, context=context) == expected


def test_symbol_subset_answers_like_the_whole_table() -> None:
    table = symbols()
    addresses = [0xFFFFFFFF81000110, 0xFFFFFFFF81000180, 0xFFFFFFFF82000030]
    subset = KernelSymbols(io.StringIO(table.subset(addresses)))
    for address in addresses:
        for backtrace in (False, True):
            assert subset.symbol(address, backtrace=backtrace) == table.symbol(
                address, backtrace=backtrace
            )


def test_a_table_without_addresses_is_refused() -> None:
    hidden = re.sub(r"(?m)^[0-9a-f]{16}", "0" * 16, KALLSYMS)
    with pytest.raises(RingBufferFormatError, match="no addresses"):
        KernelSymbols(io.StringIO(hidden))


def _btf() -> bytes:
    strings = b"\0int\0mode\0MODE_A\0MODE_B\0BIG\0__kernel_rwf_t\0s\0m\0"

    def at(name: bytes) -> int:
        return strings.index(b"\0" + name + b"\0") + 1

    types = b"".join(
        [
            struct.pack("<IIII", at(b"int"), 1 << 24, 4, 1 << 24 | 32),
            struct.pack("<III", at(b"mode"), 1 << 31 | 6 << 24 | 2, 4),
            struct.pack("<Ii", at(b"MODE_A"), 0),
            struct.pack("<Ii", at(b"MODE_B"), -1),
            struct.pack("<III", 0, 19 << 24 | 1, 8),
            struct.pack("<III", at(b"BIG"), 0, 1 << 8),
            struct.pack("<III", at(b"__kernel_rwf_t"), 8 << 24, 1),
            struct.pack("<III", at(b"s"), 4 << 24 | 1, 4),
            struct.pack("<III", at(b"m"), 1, 0),
        ]
    )
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def test_kernel_types_from_btf() -> None:
    types = KernelTypes.from_btf(_btf())
    assert types.enums == {"MODE_A": 0, "MODE_B": -1, "BIG": 1 << 40}
    assert types.typedefs == {"__kernel_rwf_t": (4, True)}
    context = KernelContext(types=types, enums={"MODE_A": 5})
    fmt = '"%d %d %lld %u", MODE_A, MODE_B, BIG, (__kernel_rwf_t)-1'
    assert render(["int v;4;1"], fmt, 0, context=context) == "5 -1 1099511627776 4294967295"


def test_btf_with_a_bad_magic_is_refused() -> None:
    with pytest.raises(RingBufferFormatError, match="magic"):
        KernelTypes.from_btf(b"\0" * 32)


def test_every_problem_is_listed_at_once() -> None:
    fields = ["void * ptr;8;0", "const char * name;8;0", "unsigned long ip;8;0"]
    fmt = event_format(
        fields,
        '"%p %s %pS %d %d %d %d %d", REC->ptr, REC->name, (void *)REC->ip, '
        "jiffies_to_msecs(REC->ip), jiffies, UNKNOWN_ENUM, "
        "({ int x = 1; x; }), REC->nothing",
    )
    with pytest.raises(PrintFmtError) as caught:
        compile_print_fmt(fmt, event_type(fmt))
    problems = caught.value.problems
    assert len(problems) == 8
    assert "hash-ptr" in problems[0]
    assert "%s of a ptr" in problems[1]
    assert "kernel's symbols" in problems[2]
    assert "jiffies_to_msecs()" in problems[3]
    assert "'jiffies'" in problems[4] and "'UNKNOWN_ENUM'" in problems[5]
    assert "statement expression" in problems[6]
    assert "no field 'nothing'" in problems[7]
    assert caught.value.label == "demo/demo"


def test_missing_arguments_and_parse_errors() -> None:
    with pytest.raises(PrintFmtError, match="has no argument"):
        compile_print_fmt(event_format(["int a;4;1"], '"%d %d", REC->a'))
    with pytest.raises(PrintFmtError, match="cannot parse"):
        compile_print_fmt(event_format(["int a;4;1"], '"%d", REC->a +'))
    with pytest.raises(PrintFmtError, match="does not start with a string"):
        compile_print_fmt(event_format(["int a;4;1"], "REC->a"))


def test_plain_pointers_follow_the_instance_hash_ptr_option() -> None:
    fields = ["void * ptr;8;0"]
    assert render(fields, '"%p|%px", REC->ptr, REC->ptr', 0xABC) == (
        "0000000000000abc|0000000000000abc"
    )
    hashed = KernelContext(hash_pointers=True)
    assert render(fields, '"%px", REC->ptr', 0xABC, context=hashed) == "0000000000000abc"
    with pytest.raises(PrintFmtError, match="hash-ptr is on"):
        render(fields, '"%p", REC->ptr', 0xABC, context=hashed)
    with pytest.raises(PrintFmtError, match="flags or a width"):
        render(fields, '"%16p", REC->ptr', 0xABC)


def _line(printer_text: str) -> bytes:
    return f"            demo-42      [000] .....     0.001000: {printer_text}\n".encode()


def test_tracepoints_carrying_their_format_print_like_trace_in_the_text_sink() -> None:
    fmt = event_format(["int a;4;1", "char comm[16];16;1"], '"a=%d comm=%s", REC->a, REC->comm')
    kind = dataclasses.replace(event_type(fmt), format=fmt)
    compile_print_fmt(fmt, kind)
    stream = io.BytesIO()
    sink = TextSink(stream)
    sink.write(event(kind, -3, "sh"))
    assert stream.getvalue() == _line("demo: a=-3 comm=sh")
    assert tracepoint_printer(kind, fmt)(event(kind, 4, "x")) == "demo: a=4 comm=x"


def test_tracepoints_without_their_format_keep_the_field_printer() -> None:
    fmt = event_format(["int a;4;1"], '"a=%d", REC->a')
    s32 = ArgType("int", "s32", 4, True)
    kind = EventType("demo", "other", ProbeKind.TRACEPOINT, ("a",), (s32,), system="demo")
    assert kind.format is None
    stream = io.BytesIO()
    TextSink(stream).write(event(kind, 7))
    assert stream.getvalue() == _line("other: a=7")
    del fmt


def test_unsupported_formats_are_refused_unless_the_caller_asks_for_the_fallback() -> None:
    fmt = event_format(["int a;4;1"], '"a=%d j=%lu", REC->a, jiffies')
    kind = dataclasses.replace(event_type(fmt), format=fmt)
    with pytest.raises(PrintFmtError, match="jiffies"):
        tracepoint_printer(kind, fmt)
    assert tracepoint_printer(kind, fmt, fallback=True)(event(kind, 5)) == (
        f"demo: {NOT_REPRODUCED} a=5"
    )
    stream = io.BytesIO()
    TextSink(stream).write(event(kind, 5))
    assert stream.getvalue() == _line(f"demo: {NOT_REPRODUCED} a=5")


PRINTK_FORMATS = """\
0xffffffff8281a73e : "Start scheduler-tick"
0xffffffff8281a800 : "tab\\there \\"quoted\\" line\\n"
"""


def test_printk_formats_are_unescaped() -> None:
    strings = parse_printk_formats(PRINTK_FORMATS)
    assert strings == {
        0xFFFFFFFF8281A73E: "Start scheduler-tick",
        0xFFFFFFFF8281A800: 'tab\there "quoted" line\n',
    }


def test_kernel_strings_print_from_printk_formats() -> None:
    context = KernelContext(strings=parse_printk_formats(PRINTK_FORMATS))
    fields = ["const char * s;8;0"]
    assert render(fields, '"%s", REC->s', 0xFFFFFFFF8281A73E, context=context) == (
        "Start scheduler-tick"
    )
    assert render(fields, '"%s|%s", REC->s, REC->s', 0, context=context) == "(null)|(null)"
    assert render(fields, '"%s", REC->s', 16, context=context) == "(efault)"
    with pytest.raises(RingBufferFormatError, match="not a tracepoint_string"):
        render(fields, '"%s", REC->s', 0xFFFFFFFF81234567, context=context)
    with pytest.raises(PrintFmtError, match="kernel memory"):
        render(fields, '"%s", REC->s', 0xFFFFFFFF8281A73E)


def test_records_a_compiled_format_cannot_print_fall_back_one_by_one() -> None:
    context = KernelContext(strings=parse_printk_formats(PRINTK_FORMATS))
    fmt = event_format(["const char * s;8;0"], '"%s", REC->s')
    kind = dataclasses.replace(event_type(fmt), format=fmt)
    assert compile_print_fmt(fmt, kind, context).may_fail
    stream = io.BytesIO()
    sink = TextSink(stream, context=context)
    sink.write(event(kind, 0xFFFFFFFF8281A73E))
    sink.write(event(kind, 0xFFFFFFFF81234567))
    assert stream.getvalue() == _line("demo: Start scheduler-tick") + _line(
        f"demo: {NOT_REPRODUCED} s={0xFFFFFFFF81234567}"
    )


def _syscall_format(name: str, fields: list[str], print_fmt: str) -> EventFormat:
    fmt = event_format(["int __syscall_nr;4;1", *fields], print_fmt, name=name)
    return dataclasses.replace(fmt, system="syscalls")


def test_syscall_events_print_like_print_syscall_enter_and_exit() -> None:
    enter = _syscall_format(
        "sys_enter_openat",
        ["int dfd;8;0", "const char * filename;8;0", "int flags;8;0", "umode_t mode;8;0"],
        '"dfd: 0x%08lx, filename: 0x%08lx, flags: 0x%08lx, mode: 0x%08lx", '
        "((unsigned long)(REC->dfd)), ((unsigned long)(REC->filename)), "
        "((unsigned long)(REC->flags)), ((unsigned long)(REC->mode))",
    )
    exit_ = _syscall_format("sys_exit_openat", ["long ret;8;1"], '"0x%lx", REC->ret')
    getpid = _syscall_format("sys_enter_getpid", [], '""')
    kind = event_type(enter)
    printer = tracepoint_printer(kind, enter)
    assert printer(event(kind, 257, 0xFFFFFF9C, 0x7FFC1000, 9, 10)) == (
        "sys_openat(dfd: 0xffffff9c, filename: 0x7ffc1000, flags: 9, mode: 0xa)"
    )
    kind = event_type(exit_)
    assert tracepoint_printer(kind, exit_)(event(kind, 257, -2)) == (
        "sys_openat -> 0xfffffffffffffffe"
    )
    kind = event_type(getpid)
    assert tracepoint_printer(kind, getpid)(event(kind, 39)) == "sys_getpid()"


def test_syscall_events_with_user_strings_are_refused() -> None:
    enter = _syscall_format(
        "sys_enter_openat",
        ["int dfd;8;0", "const char * filename;8;0", "__data_loc char[] __filename_val;4;0"],
        '"dfd: 0x%08lx", ((unsigned long)(REC->dfd))',
    )
    with pytest.raises(PrintFmtError, match="user-space strings"):
        compile_print_fmt(enter)
