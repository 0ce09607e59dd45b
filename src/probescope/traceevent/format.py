"""Parsers for tracefs's self-descriptions: `events/header_page`, `events/header_event`, each
event's `format` file, `saved_cmdlines` and `saved_tgids`.

The ring-buffer decoder is built from these values and nothing else, so a kernel that lays out
its pages or records differently is either described correctly here or refused with a
`RingBufferFormatError` that quotes the offending line. Pure text in, immutable values out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from probescope.errors import RingBufferFormatError

_FIELD_LINE = re.compile(
    r"^\s*field(?: special)?:\s*(?P<decl>[^;]*?)\s*;"
    r"\s*offset:\s*(?P<offset>\d+)\s*;"
    r"\s*size:\s*(?P<size>\d+)\s*;"
    r"(?:\s*signed:\s*(?P<signed>\d+)\s*;)?\s*$"
)
_DECLARATOR = re.compile(
    r"^(?P<type>.*?)\s*\b(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?:\[(?P<len>[^\]]*)\])?$"
)


@dataclass(frozen=True)
class FormatField:
    """One `field:` line: `field:TYPE NAME[N];	offset:O;	size:S;	signed:B;`.

    `type` is the declaration without the name and the `[N]` suffix (`unsigned long`,
    `__data_loc char[]`, `u8`); `array_length` is N, or None when the brackets are empty (probe
    arrays print `u8 arr[]` and carry their length only in `size`).
    """

    name: str
    type: str
    offset: int
    size: int
    signed: bool
    is_array: bool = False
    array_length: int | None = None

    @property
    def is_data_loc(self) -> bool:
        """`__data_loc T[]`: a u32 `len << 16 | offset-from-record-start`."""
        return self.type.startswith("__data_loc")

    @property
    def is_rel_loc(self) -> bool:
        """`__rel_loc T[]`: like `__data_loc`, offset counted from the end of this field."""
        return self.type.startswith("__rel_loc")

    @property
    def is_dynamic(self) -> bool:
        return self.is_data_loc or self.is_rel_loc

    @property
    def element_type(self) -> str:
        """The C type of one element: `char` for `__data_loc char[]` and for `char comm[16]`."""
        text = self.type
        for prefix in ("__data_loc", "__rel_loc"):
            if text.startswith(prefix):
                text = text[len(prefix) :].strip()
                if text.endswith("[]"):
                    text = text[:-2].strip()
        return text

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class EventFormat:
    """An event's `format` file: name, id (`common_type` of its records), fields, print fmt."""

    name: str
    id: int
    common_fields: tuple[FormatField, ...]
    fields: tuple[FormatField, ...]
    print_fmt: str = ""
    system: str | None = None

    @property
    def all_fields(self) -> tuple[FormatField, ...]:
        return self.common_fields + self.fields

    @property
    def fixed_size(self) -> int:
        """Bytes every record of this event has before any dynamic (`__data_loc`) data."""
        return max((f.end for f in self.all_fields), default=0)

    def field(self, name: str) -> FormatField:
        for candidate in self.all_fields:
            if candidate.name == name:
                return candidate
        known = ", ".join(f.name for f in self.all_fields)
        raise RingBufferFormatError(
            f"event {self.label!r} has no field {name!r}", hint=f"its fields are: {known}"
        )

    def has_field(self, name: str) -> bool:
        return any(f.name == name for f in self.all_fields)

    @property
    def label(self) -> str:
        return f"{self.system}/{self.name}" if self.system else self.name


@dataclass(frozen=True)
class HeaderPage:
    """`events/header_page`: where a sub-buffer keeps its timestamp, commit word and data.

    On 64-bit kernels `commit` is a `local_t` of 8 bytes at 8 and data starts at 16; `data.size`
    is the sub-buffer size minus that header (4080 for 4 KiB sub-buffers).
    """

    timestamp: FormatField
    commit: FormatField
    data: FormatField
    overwrite: FormatField | None = None

    @property
    def data_offset(self) -> int:
        return self.data.offset

    @property
    def data_size(self) -> int:
        return self.data.size

    @property
    def long_size(self) -> int:
        return self.commit.size

    @property
    def sub_buffer_size(self) -> int:
        return self.data.offset + self.data.size


@dataclass(frozen=True)
class HeaderEvent:
    """`events/header_event`: the record header's bit widths and special type_len values."""

    type_len_bits: int = 5
    time_delta_bits: int = 27
    array_bits: int = 32
    padding: int = 29
    time_extend: int = 30
    time_stamp: int = 31
    data_max_type_len: int = 28


@dataclass(frozen=True)
class PrintFormat:
    """`print fmt:` split into the format string as printf sees it and its arguments: `args`
    are the argument expressions split at top-level commas; `arguments` is the text after the
    string (`, ARG, ARG`) and `arguments_offset` where it starts in the stripped print fmt,
    for a parser that reports columns."""

    format: str
    args: tuple[str, ...]
    arguments: str = ""
    arguments_offset: int = 0


def parse_event_format(text: str, *, system: str | None = None) -> EventFormat:
    """Parse one `events/SYSTEM/EVENT/format` file."""
    name: str | None = None
    event_id: int | None = None
    fields: list[FormatField] = []
    print_fmt = ""
    where = f"{system}/" if system else ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped == "format:":
            continue
        if stripped.startswith("name:"):
            name = stripped[len("name:") :].strip()
        elif stripped.startswith("ID:"):
            value = stripped[len("ID:") :].strip()
            if not value.isdigit():
                raise RingBufferFormatError(
                    f"format of {where}{name or '?'}: line {number}: ID is not a number: {line!r}"
                )
            event_id = int(value)
        elif stripped.startswith("field"):
            fields.append(_parse_field_line(line, f"format of {where}{name or '?'}", number))
        elif stripped.startswith("print fmt:"):
            print_fmt = stripped[len("print fmt:") :].strip()
        else:
            raise RingBufferFormatError(
                f"format of {where}{name or '?'}: line {number}: unexpected line {line!r}",
                hint="expected name:, ID:, format:, field: or print fmt: lines",
            )
    if name is None or event_id is None:
        missing = "name:" if name is None else "ID:"
        raise RingBufferFormatError(f"format of {where}{name or '?'} has no {missing} line")
    common = tuple(f for f in fields if f.name.startswith("common_"))
    own = tuple(f for f in fields if not f.name.startswith("common_"))
    return EventFormat(name, event_id, common, own, print_fmt, system)


def parse_header_page(text: str) -> HeaderPage:
    """Parse `events/header_page`; requires `timestamp`, `commit` and `data` fields."""
    found: dict[str, FormatField] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            field = _parse_field_line(line, "header_page", number)
            found[field.name] = field
    for required in ("timestamp", "commit", "data"):
        if required not in found:
            raise RingBufferFormatError(f"header_page has no {required!r} field")
    header = HeaderPage(found["timestamp"], found["commit"], found["data"], found.get("overwrite"))
    if header.timestamp.size != 8:
        raise RingBufferFormatError(
            f"header_page: timestamp is {header.timestamp.size} bytes, expected 8"
        )
    if header.commit.size not in (4, 8):
        raise RingBufferFormatError(
            f"header_page: commit is {header.commit.size} bytes, expected 4 or 8"
        )
    if header.data_offset % 4 or header.data_offset < header.commit.end:
        raise RingBufferFormatError(
            f"header_page: data at offset {header.data_offset} is not 4-byte aligned after commit"
        )
    return header


_HEADER_EVENT_ITEMS = {
    "type_len_bits": re.compile(r"^\s*type_len\s*:\s*(\d+)\s*bits\s*$"),
    "time_delta_bits": re.compile(r"^\s*time_delta\s*:\s*(\d+)\s*bits\s*$"),
    "array_bits": re.compile(r"^\s*array\s*:\s*(\d+)\s*bits\s*$"),
    "padding": re.compile(r"^\s*padding\s*:\s*type\s*==\s*(\d+)\s*$"),
    "time_extend": re.compile(r"^\s*time_extend\s*:\s*type\s*==\s*(\d+)\s*$"),
    "time_stamp": re.compile(r"^\s*time_stamp\s*:\s*type\s*==\s*(\d+)\s*$"),
    "data_max_type_len": re.compile(r"^\s*data max type_len\s*==\s*(\d+)\s*$"),
}


def parse_header_event(text: str) -> HeaderEvent:
    """Parse `events/header_event` and refuse layouts the decoder does not implement."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        for key, pattern in _HEADER_EVENT_ITEMS.items():
            match = pattern.match(line)
            if match:
                values[key] = int(match.group(1))
    missing = [key for key in _HEADER_EVENT_ITEMS if key not in values]
    if missing:
        raise RingBufferFormatError(f"header_event does not describe {', '.join(missing)}")
    header = HeaderEvent(**values)
    if header.type_len_bits + header.time_delta_bits != 32 or header.array_bits != 32:
        raise RingBufferFormatError(
            f"header_event: record header is type_len:{header.type_len_bits} "
            f"time_delta:{header.time_delta_bits} array:{header.array_bits} bits, "
            "expected a 32-bit word of type_len and time_delta followed by a 32-bit array"
        )
    limit = (1 << header.type_len_bits) - 1
    special = (header.padding, header.time_extend, header.time_stamp)
    if len(set(special)) != 3 or any(not header.data_max_type_len < t <= limit for t in special):
        raise RingBufferFormatError(
            f"header_event: special types padding={header.padding} "
            f"time_extend={header.time_extend} time_stamp={header.time_stamp} must be distinct "
            f"and above data max type_len {header.data_max_type_len}"
        )
    return header


def parse_print_fmt(text: str, *, compiled: bool = False) -> PrintFormat:
    """Split `"FORMAT", ARG, ARG...` (the text after `print fmt:`) into its parts: the one
    splitter of print fmts, for every kind of event.

    The kernel writes the string two ways. Dynamic probes (trace_probe.c) and ftrace's own
    events write it as C source: escapes (`\\"%s\\"`, `\\t`) and, for ftrace, `"..." "..."`
    concatenation. TRACE_EVENT tracepoints write the *compiled* TP_printk string
    (include/trace/trace_events.h pastes `"\\"" fmt "\\", "`): tabs, newlines and backslashes
    raw, and a quote the event prints left as is; say `compiled=True` for those. Either way the
    string ends at the first (unescaped) quote followed by a comma or the end of the text; any
    other quote is part of the format, or in C source starts a concatenated string.
    """
    text = text.strip()
    if not text.startswith('"'):
        raise RingBufferFormatError(f"print fmt does not start with a string: {text[:60]!r}")
    chars: list[str] = []
    stray: int | None = None
    index = 1
    while True:
        if index >= len(text):
            if stray is not None:
                raise RingBufferFormatError(
                    f"print fmt: expected ',' after the string, got {text[stray + 1 :][:40]!r}"
                )
            raise RingBufferFormatError(f"print fmt string is not closed: {text[:60]!r}")
        ch = text[index]
        if ch == "\\" and not compiled and index + 1 < len(text):
            nxt = text[index + 1]
            chars.append(_ESCAPES.get(nxt, "\\" + nxt))
            index += 2
            continue
        if ch == '"':
            after = index + 1
            while after < len(text) and text[after].isspace():
                after += 1
            if after >= len(text) or text[after] == ",":
                break
            if text[after] == '"' and not compiled:
                index = after + 1
                continue
            if stray is None:
                stray = index
        chars.append(ch)
        index += 1
    arguments = text[index + 1 :]
    args = _split_arguments(arguments.strip()[1:]) if arguments.strip() else []
    return PrintFormat("".join(chars), tuple(args), arguments, index + 1)


_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def parse_saved_cmdlines(text: str | bytes) -> dict[int, str]:
    """`saved_cmdlines` (`PID COMM` per line) as {tid: comm}. Bytes are decoded like event
    strings (UTF-8, undecodable bytes kept as surrogate escapes)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    comms: dict[int, str] = {}
    for line in text.splitlines():
        pid, _, comm = line.partition(" ")
        if pid.isdigit():
            comms[int(pid)] = comm
    return comms


def parse_saved_tgids(text: str | bytes) -> dict[int, int]:
    """`saved_tgids` (`PID TGID` per line) as {tid: tgid}."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    tgids: dict[int, int] = {}
    for line in text.split("\n"):
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            tgids[int(parts[0])] = int(parts[1])
    return tgids


def _parse_field_line(line: str, where: str, number: int) -> FormatField:
    match = _FIELD_LINE.match(line)
    if not match:
        raise RingBufferFormatError(
            f"{where}: line {number}: expected "
            f"'field:TYPE NAME;\\toffset:N;\\tsize:N;\\tsigned:N;', got {line!r}"
        )
    decl = match.group("decl").strip()
    declarator = _DECLARATOR.match(decl)
    if not declarator or not declarator.group("type"):
        raise RingBufferFormatError(
            f"{where}: line {number}: cannot find type and name in {decl!r}"
        )
    length_text = declarator.group("len")
    is_array = length_text is not None
    length = int(length_text) if length_text and length_text.strip().isdigit() else None
    return FormatField(
        name=declarator.group("name"),
        type=declarator.group("type").strip(),
        offset=int(match.group("offset")),
        size=int(match.group("size")),
        signed=match.group("signed") == "1",
        is_array=is_array,
        array_length=length,
    )


def _split_arguments(text: str) -> list[str]:
    args: list[str] = []
    depth = 0
    quote: str | None = None
    current: list[str] = []
    escaped = False
    for ch in text:
        if quote:
            current.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    if current and "".join(current).strip():
        args.append("".join(current).strip())
    return args
