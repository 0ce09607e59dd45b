"""Ring-buffer records for events that did not come from the kernel's ring buffer (the ptrace
and bpf engines), so one reader — and trace-cmd — reads every engine's recordings.

Each event type gets a `format` file: the kernel's own when the engine had one (tracepoints
read by the bpf engine), else one laid out as the kernel lays out a uprobe event of the same
arguments (trace_probe.c: common fields, `__probe_ip` or `__probe_func`/`__probe_ret_ip`, then
each argument packed at the next offset, strings as `__data_loc char[]`, and a print fmt of
the kernel's conversions). Events are encoded by the inverse of the decoder's walk
(`traceevent.event_layout`), so decoding a record gives back the Event it was made from, and
packed into 4 KiB sub-buffers (`SubBufferPacker`) as ring_buffer.c would: a header word per
record, a TIME_EXTEND when the delta does not fit 27 bits, losses flagged in the commit word.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from probescope.errors import RecordingError
from probescope.events import Event, EventType
from probescope.language.model import STRING_TYPES, ArgType, ProbeKind
from probescope.traceevent.event_layout import INT_CODES, EventLayout, FieldValue, event_layout
from probescope.traceevent.format import EventFormat, FormatField, parse_event_format

HEADER_PAGE = (
    "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
    "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
    "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
    "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n"
)
"""`events/header_page` of a 64-bit kernel with 4 KiB sub-buffers, as the kernel prints it."""

HEADER_EVENT = (
    "# compressed entry header\n"
    "\ttype_len    :    5 bits\n"
    "\ttime_delta  :   27 bits\n"
    "\tarray       :   32 bits\n"
    "\n"
    "\tpadding     : type == 29\n"
    "\ttime_extend : type == 30\n"
    "\ttime_stamp : type == 31\n"
    "\tdata max type_len  == 28\n"
)

FIRST_SYNTHESIZED_ID = 0xF000
"""Event ids given to synthesized formats: above any the kernel hands out in practice."""

COMMON_FIELDS = (
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
)

PAGE_SIZE = 4096
DATA_OFFSET = 16
DATA_SIZE = PAGE_SIZE - DATA_OFFSET
DATA_MAX_TYPE_LEN = 28
TIME_EXTEND = 30
DELTA_LIMIT = 1 << 27
MISSED_EVENTS = 1 << 31
MISSED_STORED = 1 << 30


def format_text(event_format: EventFormat) -> str:
    """The `format` file text of a parsed format, as the kernel prints one."""
    lines = [f"name: {event_format.name}", f"ID: {event_format.id}", "format:"]
    lines += [_field_line(f) for f in event_format.common_fields]
    lines.append("")
    lines += [_field_line(f) for f in event_format.fields]
    lines += ["", f"print fmt: {event_format.print_fmt}", ""]
    return "\n".join(lines)


def _field_line(field: FormatField) -> str:
    declarator = f"{field.type} {field.name}"
    if field.is_array:
        declarator += f"[{field.array_length}]" if field.array_length is not None else "[]"
    return (
        f"\tfield:{declarator};\toffset:{field.offset};\tsize:{field.size};"
        f"\tsigned:{int(field.signed)};"
    )


def probe_format_text(event_type: EventType, event_id: int) -> str:
    """The `format` file the kernel would give a uprobe (or uretprobe) event of `event_type`'s
    arguments."""
    lines = [f"name: {event_type.name}", f"ID: {event_id}", "format:", COMMON_FIELDS]
    offset = 8
    if event_type.kind.is_return:
        lines.append("\tfield:unsigned long __probe_func;\toffset:8;\tsize:8;\tsigned:0;")
        lines.append("\tfield:unsigned long __probe_ret_ip;\toffset:16;\tsize:8;\tsigned:0;")
        offset = 24
        head, head_args = "(%lx <- %lx)", ["REC->__probe_func", "REC->__probe_ret_ip"]
    else:
        lines.append("\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;")
        offset = 16
        head, head_args = "(%lx)", ["REC->__probe_ip"]
    conversions: list[str] = []
    for name, arg_type in zip(event_type.arg_names, event_type.arg_types, strict=True):
        declarator, size, signed = _probe_field(name, arg_type)
        lines.append(
            f"\tfield:{declarator};\toffset:{offset};\tsize:{size};\tsigned:{int(signed)};"
        )
        offset += size
        conversion, values = _probe_conversion(name, arg_type)
        conversions.append(f" {name}={conversion}")
        head_args += values
    fmt = (head + "".join(conversions)).replace('"', '\\"')
    lines += ["", f'print fmt: "{fmt}", {", ".join(head_args)}', ""]
    return "\n".join(lines)


def _probe_field(name: str, arg_type: ArgType) -> tuple[str, int, bool]:
    """(declarator, size, signed) of a probe argument's field, as trace_probe.c writes it."""
    if arg_type.base in STRING_TYPES:
        if arg_type.count:
            return f"__data_loc char[][{arg_type.count}] {name}", 4 * arg_type.count, True
        return f"__data_loc char[] {name}", 4, True
    bits = arg_type.size * 8
    element = f"{'s' if arg_type.signed else 'u'}{bits}"
    if arg_type.count:
        return f"{element} {name}[]", arg_type.size * arg_type.count, arg_type.signed
    return f"{element} {name}", arg_type.size, arg_type.signed


def _probe_conversion(name: str, arg_type: ArgType) -> tuple[str, list[str]]:
    """The print fmt conversion and arguments trace_probe.c gives an argument."""
    if arg_type.base in STRING_TYPES:
        element = '"%s"'
        values = (
            [f"__get_str({name}[{n}])" for n in range(arg_type.count)]
            if arg_type.count
            else [f"__get_str({name})"]
        )
    else:
        wide = "L" if arg_type.size == 8 else ""
        if arg_type.base == "char":
            element = "'%c'"
        elif arg_type.is_hex:
            element = f"0x%{wide}x"
        elif arg_type.signed:
            element = f"%{wide}d"
        else:
            element = f"%{wide}u"
        values = (
            [f"REC->{name}[{n}]" for n in range(arg_type.count)]
            if arg_type.count
            else [f"REC->{name}"]
        )
    if arg_type.count:
        return "{" + ",".join([element] * arg_type.count) + "}", values
    return element, values


Encoder = Callable[[Event], bytes]


@dataclass
class _Known:
    event_id: int
    system: str
    text: str
    encode: Encoder


class EventEncoder:
    """Formats and records for the event types of a session, assigned as they first appear.

    `encode(event)` gives the record payload; `formats` the `(system, format text)` of every
    type seen; `event_types` the EventType behind each id, for the recording's facts."""

    def __init__(self) -> None:
        self._known: dict[EventType, _Known] = {}
        self._next_id = FIRST_SYNTHESIZED_ID
        self._ids_taken: set[int] = set()
        self.event_types: dict[int, EventType] = {}

    @property
    def formats(self) -> list[tuple[str, str]]:
        return [(known.system, known.text) for known in self._known.values()]

    def encode(self, event: Event) -> bytes:
        known = self._known.get(event.type)
        if known is None:
            known = self._learn(event.type)
        return known.encode(event)

    def _learn(self, event_type: EventType) -> _Known:
        real = event_type.format
        if isinstance(real, EventFormat) and real.id not in self._ids_taken:
            event_format, system = real, real.system or event_type.group
            text = format_text(real)
        else:
            while self._next_id in self._ids_taken:
                self._next_id += 1
            if self._next_id >= 1 << 16:
                raise RecordingError("more than 4096 event types in one recording")
            kind = event_type.kind
            if kind not in (ProbeKind.UPROBE, ProbeKind.URETPROBE, ProbeKind.USDT):
                raise RecordingError(
                    f"event {event_type.group}/{event_type.name}: a {kind} event without its "
                    "kernel format cannot be recorded"
                )
            system = event_type.group
            text = probe_format_text(event_type, self._next_id)
            event_format = parse_event_format(text, system=system)
        self._ids_taken.add(event_format.id)
        kind = event_type.kind
        layout = event_layout(
            event_format,
            system,
            None,
            kind if kind is not ProbeKind.USDT else ProbeKind.UPROBE,
            event_type,
        )
        known = _Known(event_format.id, system, text, _compile_encoder(layout))
        self._known[event_type] = known
        self.event_types[event_format.id] = event_type
        return known


def _compile_encoder(layout: EventLayout) -> Encoder:
    """An encoder of one event type's records: fixed part packed with one `struct`, dynamic
    data (strings, `__data_loc` bytes, a trailing array) appended after it."""
    fmt = layout.format
    fixed = fmt.fixed_size
    head = struct.Struct("<HBBi")
    event_id = fmt.id
    ip_at = fmt.field(layout.ip_field).offset if layout.ip_field else None
    ret_at = fmt.field(layout.ret_ip_field).offset if layout.ret_ip_field else None
    writers = [_value_writer(value) for value in layout.values]

    def encode(event: Event) -> bytes:
        record = bytearray(fixed)
        head.pack_into(
            record, 0, event_id, event.flags & 0xFF, event.preempt_count & 0xFF, event.tid
        )
        if ip_at is not None:
            struct.pack_into("<Q", record, ip_at, event.ip & 0xFFFFFFFFFFFFFFFF)
        if ret_at is not None:
            struct.pack_into("<Q", record, ret_at, (event.ret_ip or 0) & 0xFFFFFFFFFFFFFFFF)
        for writer, value in zip(writers, event.args, strict=True):
            writer(record, value)
        return bytes(record)

    return encode


_Writer = Callable[[bytearray, Any], None]


def _value_writer(value: FieldValue) -> _Writer:
    field = value.field
    at = field.offset
    if value.kind == "int":
        code = "<" + INT_CODES[(value.size, value.signed)] * (value.count or 1)
        mask = (1 << (8 * value.size)) - 1
        if value.count:
            return lambda record, v: struct.pack_into(
                code, record, at, *[_fit(x, mask, value.signed) for x in v]
            )
        return lambda record, v: struct.pack_into(code, record, at, _fit(v, mask, value.signed))
    if value.kind == "char":
        if value.count:
            return lambda record, v: record.__setitem__(
                slice(at, at + value.count), b"".join(_char(c) for c in v)
            )
        return lambda record, v: record.__setitem__(slice(at, at + 1), _char(v))
    if value.kind == "string":
        if value.count:

            def strings(record: bytearray, v: Any) -> None:
                for n, item in enumerate(v):
                    _dynamic(record, field, at + 4 * n, _text(item))

            return strings
        return lambda record, v: _dynamic(record, field, at, _text(v))
    # bytes
    if field.size == 0:
        return lambda record, v: record.extend(v)
    if field.is_dynamic:
        return lambda record, v: _dynamic(record, field, at, bytes(v))
    size = field.size

    def fixed_bytes(record: bytearray, v: Any) -> None:
        data = v.encode("utf-8", "surrogateescape") if isinstance(v, str) else bytes(v)
        record[at : at + size] = data[:size].ljust(size, b"\0")

    return fixed_bytes


def _fit(value: Any, mask: int, signed: bool) -> int:
    number = int(value)
    if signed:
        bits = mask.bit_length()
        number &= mask
        return number - (1 << bits) if number >> (bits - 1) else number
    return number & mask


def _char(value: object) -> bytes:
    data = str(value).encode("utf-8", "surrogateescape")
    return data[:1] or b"\0"


def _text(value: object) -> bytes | None:
    if value is None:
        return None
    return str(value).encode("utf-8", "surrogateescape") + b"\0"


def _dynamic(record: bytearray, field: FormatField, at: int, data: bytes | None) -> None:
    """Append `data` to the record and point the `__data_loc`/`__rel_loc` word at it (length
    0 for a string that could not be read, which the decoder gives back as None)."""
    if not data:
        struct.pack_into("<I", record, at, 0)
        return
    start = len(record)
    record.extend(data)
    base = at + 4 if field.is_rel_loc else 0
    if start - base >= 1 << 16 or len(data) >= 1 << 16:
        raise RecordingError(f"field {field.name!r}: {len(data)} bytes do not fit a record")
    struct.pack_into("<I", record, at, len(data) << 16 | (start - base))


class SubBufferPacker:
    """Records of one CPU packed into 4 KiB sub-buffers as the kernel's ring buffer lays them
    out; `add` returns the sub-buffers it completed, `flush` the last one."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._page_time = 0
        self._last = 0
        self._lost = 0

    def lose(self, count: int) -> list[bytes]:
        """Events were lost before the next record (count < 0: unknown): the kernel flags that
        on the next sub-buffer, so the one being filled is finished and returned."""
        done = [self.flush()] if self._data else []
        if count < 0 or self._lost < 0:
            self._lost = -1
        else:
            self._lost += count
        return done

    def add(self, timestamp: int, payload: bytes) -> list[bytes]:
        done: list[bytes] = []
        length = len(payload)
        padded = payload + bytes(-length % 4)
        record_size = 4 + len(padded) if len(padded) <= 4 * DATA_MAX_TYPE_LEN else 8 + len(padded)
        if record_size > DATA_SIZE - 8:
            raise RecordingError(f"a record of {length} bytes does not fit a sub-buffer")
        delta = timestamp - self._last
        extend = bool(self._data) and delta >= DELTA_LIMIT
        need = record_size + (8 if extend else 0)
        if self._data and (delta < 0 or len(self._data) + need > DATA_SIZE - 8):
            done.append(self.flush())
        if not self._data:
            self._page_time = self._last = timestamp
            delta, extend = 0, False
        if extend:
            self._data += struct.pack(
                "<II", TIME_EXTEND | (delta & (DELTA_LIMIT - 1)) << 5, delta >> 27
            )
            delta = 0
        if len(padded) <= 4 * DATA_MAX_TYPE_LEN and padded:
            self._data += struct.pack("<I", len(padded) // 4 | delta << 5)
        else:
            self._data += struct.pack("<II", delta << 5, length + 4)
        self._data += padded
        self._last = timestamp
        return done

    def flush(self) -> bytes:
        """The sub-buffer being filled, finished (empty bytes when it holds nothing and no loss
        is pending)."""
        if not self._data and not self._lost:
            return b""
        commit = len(self._data)
        tail = b""
        if self._lost:
            commit |= MISSED_EVENTS
            if self._lost > 0:
                commit |= MISSED_STORED
                tail = struct.pack("<Q", self._lost)
            self._lost = 0
        page = struct.pack("<QQ", self._page_time, commit) + self._data + tail
        self._data = bytearray()
        return page.ljust(PAGE_SIZE, b"\0")
