"""How an event's records map onto an `Event`: which `format` fields hold its values, read as
what (integers, characters, strings, bytes), and the `EventType` they carry.

The argument types of a dynamic probe come from its `ProbeSpec` (the `format` file shows x32 as
u32 and loses bitfields) or, without one, from its `print fmt`; a tracepoint's from its fields.
Every mismatch between a format and the probe that should have made it is refused here, once
per event, so the decoder's per-record loop checks nothing but bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from probescope.errors import RingBufferFormatError
from probescope.events import EventType
from probescope.language.model import STRING_TYPES, ArgType, ProbeKind, ProbeSpec
from probescope.traceevent.format import EventFormat, FormatField, parse_print_fmt

INT_CODES = {
    (size, signed): code.lower() if signed else code
    for size, code in ((1, "B"), (2, "H"), (4, "I"), (8, "Q"))
    for signed in (False, True)
}
"""`struct` codes of the integers a record holds, by (size, signed)."""

_PROBE_CONVERSION = re.compile(r" (?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<conv>\{[^}]*\}|\S+)")


@dataclass(frozen=True)
class FieldValue:
    """How to read one argument from a record: `kind` is int, char, string or bytes."""

    name: str
    field: FormatField
    kind: str
    size: int = 0
    signed: bool = False
    count: int = 0

    def struct_codes(self) -> str:
        if self.kind == "bytes":
            return "I" if self.field.is_dynamic else f"{self.field.size}s"
        if self.kind == "string":
            return "I" * (self.count or 1)
        return INT_CODES[(self.size, self.signed)] * (self.count or 1)


@dataclass(frozen=True)
class EventLayout:
    """One event's `format` with what the decoder reads of each record: the values in
    argument order, the fields holding the probed address and return address (probes only),
    and the `EventType` its Events carry."""

    format: EventFormat
    event_type: EventType
    values: tuple[FieldValue, ...]
    ip_field: str | None
    ret_ip_field: str | None


def infer_probe_arg_types(event_format: EventFormat) -> tuple[tuple[str, ArgType], ...]:
    """Argument names and types of a probe event from its `format` alone (no spec).

    The field types lose `x`/`char`/bitfield distinctions, but `print fmt` keeps each
    argument's printf conversion (`0x%x`, `'%c'`, `\\"%s\\"`, `{%u,%u}`), which is enough.
    """
    conversions: dict[str, str] = {}
    if event_format.print_fmt:
        text = parse_print_fmt(event_format.print_fmt).format
        for match in _PROBE_CONVERSION.finditer(text):
            conversions[match.group("name")] = match.group("conv")
    result: list[tuple[str, ArgType]] = []
    for field in event_format.fields:
        if field.name in ("__probe_ip", "__probe_func", "__probe_ret_ip"):
            continue
        conversion = conversions.get(field.name, "")
        element = conversion
        count = 0
        if conversion.startswith("{"):
            element = conversion[1:-1].split(",", 1)[0]
            count = conversion.count(",") + 1
        if field.is_data_loc or element == '"%s"':
            arg_type = ArgType("string", "string", 4, False, count=count)
        else:
            size = field.size // count if count else field.size
            bits = size * 8
            if element == "'%c'":
                arg_type = ArgType("char", "char", 1, False, count=count)
            elif "x" in element:
                arg_type = ArgType(f"x{bits}", f"x{bits}", size, False, count=count)
            elif field.signed or "d" in element:
                arg_type = ArgType(f"s{bits}", f"s{bits}", size, True, count=count)
            else:
                arg_type = ArgType(f"u{bits}", f"u{bits}", size, False, count=count)
        result.append((field.name, arg_type))
    return tuple(result)


def event_layout(
    event_format: EventFormat,
    group: str,
    spec: ProbeSpec | None,
    kind: ProbeKind | None,
    event_type: EventType | None,
) -> EventLayout:
    """What the decoder reads of `event_format`'s records, for events of `group`.

    `spec` types the arguments of a dynamic probe; `kind` defaults to uprobe/uretprobe for
    probe layouts and tracepoint for the rest; a given `event_type` is used as is (it must
    have as many arguments as the format has values), else one is made.
    """
    is_return_layout = event_format.has_field("__probe_ret_ip")
    is_probe_layout = is_return_layout or event_format.has_field("__probe_ip")
    if kind is None:
        if is_probe_layout:
            kind = ProbeKind.URETPROBE if is_return_layout else ProbeKind.UPROBE
        else:
            kind = ProbeKind.TRACEPOINT
    ip_field: str | None = None
    ret_ip_field: str | None = None
    named_by_spec = False
    if kind in (ProbeKind.TRACEPOINT, ProbeKind.FUNCTION):
        named = _tracepoint_values(event_format)
    else:
        if kind.is_return:
            if not is_return_layout:
                raise RingBufferFormatError(
                    f"event {event_format.label!r} is a {kind} but its format has no "
                    "__probe_func/__probe_ret_ip fields"
                )
            ip_field, ret_ip_field = "__probe_func", "__probe_ret_ip"
        else:
            if not event_format.has_field("__probe_ip"):
                raise RingBufferFormatError(
                    f"event {event_format.label!r} is a {kind} but its format has no "
                    "__probe_ip field"
                )
            ip_field = "__probe_ip"
        named_by_spec = spec is not None
        if spec is not None:
            typed = tuple((arg.name, arg.type) for arg in spec.args)
        else:
            typed = infer_probe_arg_types(event_format)
        named = tuple(
            (_probe_value(event_format, name, arg_type), arg_type) for name, arg_type in typed
        )
    if event_type is None and spec is not None and named_by_spec:
        event_type = EventType.of_probe(
            spec,
            kind,
            group=group,
            name=event_format.name,
            fields=tuple(f.name for f in event_format.fields),
            format=event_format,
        )
    elif event_type is None:
        event_type = EventType(
            group=group,
            name=event_format.name,
            kind=kind,
            arg_names=tuple(value.name for value, _ in named),
            arg_types=tuple(arg_type for _, arg_type in named),
            system=group if kind is ProbeKind.TRACEPOINT else None,
            fields=tuple(f.name for f in event_format.fields),
            format=event_format,
        )
    elif len(event_type.arg_names) != len(named):
        raise RingBufferFormatError(
            f"event {event_format.label!r}: the given EventType has "
            f"{len(event_type.arg_names)} arguments, the format {len(named)}"
        )
    return EventLayout(
        event_format, event_type, tuple(value for value, _ in named), ip_field, ret_ip_field
    )


def _probe_value(event_format: EventFormat, name: str, arg_type: ArgType) -> FieldValue:
    field = event_format.field(name)
    count = arg_type.count
    if arg_type.base in STRING_TYPES:
        if count == 0 and not field.is_dynamic:
            raise _mismatch(event_format, field, arg_type, "a __data_loc string field")
        expected = 4 * (count or 1)
        if field.size != expected:
            raise _mismatch(event_format, field, arg_type, f"{expected} bytes")
        return FieldValue(name, field, "string", 4, False, count)
    if arg_type.base == "char":
        kind = "char"
    elif arg_type.base == "symbol" or arg_type.base[:1] in ("u", "s", "x"):
        kind = "int"
    else:
        raise RingBufferFormatError(
            f"event {event_format.label!r}: argument {name!r} has type {arg_type.name!r}, "
            "which the decoder does not know"
        )
    if arg_type.size not in (1, 2, 4, 8):
        raise _mismatch(event_format, field, arg_type, "elements of 1, 2, 4 or 8 bytes")
    if field.size != arg_type.size * (count or 1):
        raise _mismatch(event_format, field, arg_type, f"{arg_type.size * (count or 1)} bytes")
    return FieldValue(name, field, kind, arg_type.size, arg_type.signed and kind == "int", count)


def _mismatch(
    event_format: EventFormat, field: FormatField, arg_type: ArgType, expected: str
) -> RingBufferFormatError:
    return RingBufferFormatError(
        f"format of {event_format.label!r} does not match its probe: field {field.name!r} is "
        f"'{field.type}' of {field.size} bytes, type {arg_type} needs {expected}",
        hint="the event was redefined with other arguments; re-read its format",
    )


def _tracepoint_values(event_format: EventFormat) -> tuple[tuple[FieldValue, ArgType], ...]:
    result: list[tuple[FieldValue, ArgType]] = []
    for field in event_format.fields:
        element = field.element_type
        if field.is_dynamic:
            if element.endswith("char"):
                value = FieldValue(field.name, field, "string", 4)
                arg_type = ArgType(field.type, "string", 4, False)
            else:
                value = FieldValue(field.name, field, "bytes")
                arg_type = ArgType(field.type, "bytes", field.size, False)
        elif field.is_array:
            length = field.array_length
            if element in ("char", "signed char", "unsigned char") and field.size == (length or 0):
                value = FieldValue(field.name, field, "bytes")
                arg_type = ArgType(f"{element}[{length}]", "string", field.size, False)
            elif length and field.size % length == 0 and field.size // length in (1, 2, 4, 8):
                size = field.size // length
                value = FieldValue(field.name, field, "int", size, field.signed, length)
                arg_type = _int_type(field.type, size, field.signed, length)
            else:
                value = FieldValue(field.name, field, "bytes")
                arg_type = ArgType(field.type, "bytes", field.size, False)
        elif field.size in (1, 2, 4, 8):
            value = FieldValue(field.name, field, "int", field.size, field.signed)
            arg_type = _int_type(field.type, field.size, field.signed, 0)
        else:
            value = FieldValue(field.name, field, "bytes")
            arg_type = ArgType(field.type, "bytes", field.size, False)
        result.append((value, arg_type))
    return tuple(result)


def _int_type(name: str, size: int, signed: bool, count: int) -> ArgType:
    base = f"{'s' if signed else 'u'}{size * 8}"
    return ArgType(name, base, size, signed, count=count)


def check_common_fields(event_format: EventFormat) -> None:
    expected = {
        "common_type": (0, 2),
        "common_flags": None,
        "common_preempt_count": None,
        "common_pid": None,
    }
    for name, place in expected.items():
        field = event_format.field(name)
        if place is not None and (field.offset, field.size) != place:
            raise RingBufferFormatError(
                f"event {event_format.label!r}: {name} is at offset {field.offset} with size "
                f"{field.size}; the decoder needs it at offset 0 with size 2"
            )
