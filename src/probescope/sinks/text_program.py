"""A recording's text output through the compiled loop (`traceevent/_fastformat.c`), with the
format program of each event type compiled here from what the text sink knows.

`write_text(source, sink)` is the one entry point: it prints every event of a recording as
`sink.write_batch` would for `source.batches()`, byte for byte, and takes the compiled loop when
it is built, switched on (`traceevent.accel`) and the sink and data are ones it reads
(a binary stream, little-endian sub-buffers); else it runs that Python loop itself.

A program is what `probe_printer` prints, as ops: literal text, an integer field (decimal or
`%x`), a char, a `__data_loc` string. An event type whose printer is anything else (a
tracepoint's print fmt, kprobe symbols, symbol or bytes arguments, uncommon common fields) gets
a program that only checks its records; the C loop then asks `sink.format` for its line, in the
same place of the merged stream. Every program starts with the checks the Python decoder makes
of a record (its fixed size, its string locations), so a bad record stops both paths alike.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from typing import Protocol

from probescope.events import EventBatch
from probescope.language.model import STRING_TYPES, ArgType, ProbeKind
from probescope.sinks.text import EVENT_PRINTERS, TextSink, probe_printer
from probescope.traceevent.accel import RawCpuStream, accelerator
from probescope.traceevent.event_layout import EventLayout, FieldValue
from probescope.traceevent.format import FormatField

MODE_FORMAT = 1
MODE_FALLBACK = 2
_LITERAL, _INT, _CHAR, _STRING = (ord(c) for c in "LICS")
_MAX_LITERAL = 0xFFFF


class RawRecording(Protocol):
    """What `write_text` reads of a recording (`record.recording.Recording` is one)."""

    def batches(self) -> Iterator[EventBatch]: ...

    def raw_streams(self) -> list[RawCpuStream]: ...

    def event_layout(self, event_id: int) -> EventLayout | None: ...


def write_text(source: RawRecording, sink: TextSink) -> tuple[int, int]:
    """Print every event of `source` into `sink`; return (events, events lost)."""
    fast = _fast_path(source, sink)
    if fast is not None:
        return fast
    events = lost = 0
    for batch in source.batches():
        if batch.events or batch.lost:
            sink.write_batch(batch)
            events += len(batch.events)
            lost += max(batch.lost, 0)
    return events, lost


def _fast_path(source: RawRecording, sink: TextSink) -> tuple[int, int] | None:
    module = accelerator()
    if module is None or type(sink) is not TextSink or not sink.binary:
        return None
    if sys.byteorder != "little":
        return None
    streams = source.raw_streams()
    if not streams:
        return None
    header = streams[0].decoder.layout.header_event
    for stream in streams:
        layout = stream.decoder.layout
        if layout.byteorder != "little" or layout.header_event != header:
            return None
    if header.type_len_bits + header.time_delta_bits != 32:
        return None
    decoder = streams[0].decoder

    def resolve(event_id: int) -> bytes | None:
        layout = source.event_layout(event_id)
        return None if layout is None else format_program(layout, sink)

    def skip(event_id: int) -> None:
        decoder.skipped[event_id] = decoder.skipped.get(event_id, 0) + 1

    def task(tid: int) -> bytes:
        return _encode(sink.context_columns(tid, decoder.comm(tid)))

    def flags(key: int) -> bytes:
        return _encode(sink.flag_column(key >> 8, key & 0xFF))

    def fallback(index: int, sub_buffer: bytes, start: int, pos: int, ts: int) -> bytes:
        stream = streams[index]
        event = stream.decoder.decode_record(sub_buffer, start, pos, ts, stream.cpu)
        return _encode(sink.format(event))

    def check(index: int, sub_buffer: bytes) -> object:
        return streams[index].decoder.decode(sub_buffer, streams[index].cpu)

    result: tuple[int, int] = module.render(
        [
            (
                stream.cpu,
                stream.decoder.layout.size,
                stream.decoder.layout.data_offset,
                stream.decoder.layout.timestamp_offset,
                stream.decoder.layout.commit_offset,
                stream.decoder.layout.long_size,
                stream.chunks,
            )
            for stream in streams
        ],
        (
            header.type_len_bits,
            header.data_max_type_len,
            header.padding,
            header.time_extend,
            header.time_stamp,
        ),
        resolve,
        skip,
        task,
        flags if sink.irq_info else None,
        fallback,
        check,
        sink.stream.write,
        sink.in_ns,
        sink.lost_lines,
    )
    return result


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def format_program(layout: EventLayout, sink: TextSink) -> bytes:
    """The program of one event type: its record checks, then its line as ops when the text
    sink prints it with `probe_printer`, else a request to print it with Python."""
    checks = _checks(layout)
    head = struct.pack("<BHH", MODE_FORMAT, layout.format.fixed_size, len(checks))
    ops = _line_ops(layout, sink)
    if ops is None:
        return bytes([MODE_FALLBACK]) + head[1:] + b"".join(checks)
    return head + b"".join(checks) + ops


def _checks(layout: EventLayout) -> list[bytes]:
    """The `__data_loc`/`__rel_loc` words the decoder bounds-checks, with the base each
    location counts from (the record, or the field's end)."""
    checks = []
    for value in layout.values:
        field = value.field
        located = value.kind == "string" or (  # as decoder._value_lines decides
            value.kind == "bytes"
            and field.size != 0
            and not (field.is_array and field.element_type.endswith("char"))
            and field.is_dynamic
        )
        if not located:
            continue
        base = field.end if field.is_rel_loc else 0
        for n in range(value.count or 1):
            checks.append(struct.pack("<HH", field.offset + 4 * n, base))
    return checks


def _line_ops(layout: EventLayout, sink: TextSink) -> bytes | None:
    """The common fields the line's columns read, then `probe_printer`'s text as ops; None
    where this module does not print exactly what the sink prints."""
    event_type = layout.event_type
    kind = event_type.kind
    if kind not in (ProbeKind.UPROBE, ProbeKind.URETPROBE, ProbeKind.USDT):
        return None
    if EVENT_PRINTERS.get(kind) is not probe_printer:
        return None
    fmt = layout.format
    flags, preempt, pid = (
        fmt.field(name) for name in ("common_flags", "common_preempt_count", "common_pid")
    )
    if (flags.size, flags.signed, preempt.size, preempt.signed) != (1, False, 1, False):
        return None
    if (pid.size, pid.signed) != (4, True):
        return None
    if len(event_type.arg_types) != len(layout.values):
        return None
    ops = _Ops(fmt.fixed_size)
    if kind.is_return:
        if layout.ret_ip_field is None or layout.ip_field is None:
            return None
        ops.literal(f"{event_type.name}: (0x")
        ops.integer(fmt.field(layout.ret_ip_field), hexadecimal=True)
        ops.literal(" <- 0x")
        ops.integer(fmt.field(layout.ip_field), hexadecimal=True)
    else:
        if layout.ip_field is None:
            return None
        ops.literal(f"{event_type.name}: (0x")
        ops.integer(fmt.field(layout.ip_field), hexadecimal=True)
    ops.literal(")")
    for index, name, arg_type in event_type.shown_arguments():
        value = layout.values[index]
        ops.literal(f" {name}=")
        if not ops.argument(arg_type, value):
            return None
    if not ops.fits:
        return None
    return struct.pack("<HHH", flags.offset, preempt.offset, pid.offset) + bytes(ops.code)


class _Ops:
    """Ops of one line, refusing any read past the record's fixed part."""

    def __init__(self, fixed_size: int) -> None:
        self.code = bytearray()
        self.fixed_size = fixed_size
        self.fits = True

    def literal(self, text: str) -> None:
        data = _encode(text)
        for start in range(0, len(data), _MAX_LITERAL):
            piece = data[start : start + _MAX_LITERAL]
            self.code += struct.pack("<BH", _LITERAL, len(piece)) + piece

    def _read(self, offset: int, size: int) -> bool:
        self.fits = self.fits and offset >= 0 and offset + size <= min(self.fixed_size, 0xFFFF)
        return self.fits

    def integer(self, field: FormatField, *, hexadecimal: bool) -> None:
        if field.size not in (1, 2, 4, 8) or field.is_array:
            self.fits = False
            return
        self._int(field.offset, field.size, field.signed, hexadecimal)

    def _int(self, offset: int, size: int, signed: bool, hexadecimal: bool) -> None:
        if self._read(offset, size):
            self.code += struct.pack("<BHBBB", _INT, offset, size, signed, hexadecimal)

    def argument(self, arg_type: ArgType, value: FieldValue) -> bool:
        """`_arg_printer` of the text sink, for the kinds this loop prints."""
        base = arg_type.base
        count = arg_type.count
        if count != value.count:
            return False
        offset = value.field.offset
        if base in STRING_TYPES:
            if value.kind != "string":
                return False
            base_add = value.field.end if value.field.is_rel_loc else 0
            elements = [(offset + 4 * n, base_add) for n in range(count or 1)]
            self._array(count, elements, self._string)
            return self.fits
        if base in ("char", "bytes", "symbol"):
            if base != "char" or value.kind != "char":
                return False
            self._array(count, [(offset + n, 0) for n in range(count or 1)], self._char)
            return self.fits
        if value.kind != "int" or value.size not in (1, 2, 4, 8):
            return False
        hexadecimal = base.startswith("x")
        size, signed = value.size, value.signed

        def number(at: int, _: int) -> None:
            if hexadecimal:
                self.literal("0x")
            self._int(at, size, signed, hexadecimal)

        self._array(count, [(offset + size * n, 0) for n in range(count or 1)], number)
        return self.fits

    def _array(self, count: int, elements: list[tuple[int, int]], element: _Element) -> None:
        """One element, or `{e,e,...}` for an array type."""
        if count:
            self.literal("{")
        for n, (offset, extra) in enumerate(elements):
            if n:
                self.literal(",")
            element(offset, extra)
        if count:
            self.literal("}")

    def _string(self, offset: int, base_add: int) -> None:
        if self._read(offset, 4):
            self.code += struct.pack("<BHH", _STRING, offset, base_add)

    def _char(self, offset: int, _: int) -> None:
        self.literal("'")
        if self._read(offset, 1):
            self.code += struct.pack("<BH", _CHAR, offset)
        self.literal("'")


class _Element(Protocol):
    def __call__(self, offset: int, extra: int, /) -> None: ...
