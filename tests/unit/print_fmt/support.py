"""Build small tracepoint formats and events in memory for the print fmt tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from probescope.events import Event, EventType
from probescope.language.model import ProbeKind
from probescope.traceevent.context import KernelContext
from probescope.traceevent.format import EventFormat, FormatField, parse_event_format
from probescope.traceevent.print_fmt import compile_print_fmt

COMMON = """\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;
"""


def event_format(fields: Sequence[str], print_fmt: str, *, name: str = "demo") -> EventFormat:
    """A format from `TYPE NAME;SIZE;SIGNED` field specs (offsets laid out in order) and the
    text after `print fmt: `, which may hold raw tabs and newlines as TRACE_EVENT formats do."""
    lines = [f"name: {name}", "ID: 900", "format:", COMMON.rstrip("\n"), ""]
    offset = 8
    for spec in fields:
        declaration, size, signed = spec.rsplit(";", 2)
        lines.append(f"\tfield:{declaration};\toffset:{offset};\tsize:{size};\tsigned:{signed};")
        offset += int(size)
    lines += ["", 'print fmt: ""', ""]
    parsed = parse_event_format("\n".join(lines), system="demo")
    return dataclasses.replace(parsed, print_fmt=print_fmt)


def event_type(fmt: EventFormat) -> EventType:
    return EventType(
        "demo",
        fmt.name,
        ProbeKind.TRACEPOINT,
        tuple(f.name for f in fmt.fields),
        system="demo",
        fields=tuple(f.name for f in fmt.fields),
    )


def event(kind: EventType, *args: Any, tid: int = 42, flags: int = 0, preempt: int = 0) -> Event:
    return Event(1_000_000, 0, tid, tid, "demo", kind, 0, None, tuple(args), flags, preempt)


def render(
    fields: Sequence[str],
    print_fmt: str,
    *args: Any,
    context: KernelContext | None = None,
    **extra: Any,
) -> str:
    """The text after `NAME: ` for one record with field values `args`."""
    fmt = event_format(fields, print_fmt)
    kind = event_type(fmt)
    printer = compile_print_fmt(fmt, kind, context or KernelContext(hash_pointers=False))
    return printer.function()(event(kind, *args, **extra))


def field(name: str, type_: str, size: int, signed: bool) -> FormatField:
    return FormatField(name, type_, 8, size, signed)
