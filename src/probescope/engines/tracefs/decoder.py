"""Ring-buffer records to `Event`s: one compiled decoder per tracefs instance.

Each event's `format` file (and, for probes, the `ProbeSpec` that defined it) is turned once into
a `struct` layout and a few lines of Python that build the `Event`; those lines are spliced into
the sub-buffer walk of `ringbuffer.compile_reader`, so decoding a record costs one `struct`
unpack, a tuple and no parsing. Argument values follow the probe's types: integers for
u/s/x types (the kernel stores bitfields already extracted), a one-character `str` for `char`,
`str` or None (the kernel's `(fault)`) for strings, tuples for arrays. Event strings are decoded
as UTF-8 with undecodable bytes kept as surrogate escapes, so `s.encode("utf-8",
"surrogateescape")` gives back the kernel's bytes. `merge_cpu_batches` then puts the per-CPU
batch streams in the order the kernel's `trace` file prints them.
"""

from __future__ import annotations

import heapq
import re
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter

from probescope.engines.tracefs.format import EventFormat, FormatField, parse_print_fmt
from probescope.engines.tracefs.ringbuffer import (
    SubBufferLayout,
    SubBufferReader,
    compile_reader,
    split_sub_buffers,
)
from probescope.errors import RingBufferFormatError
from probescope.events import Event, EventBatch, EventType
from probescope.language.model import STRING_TYPES, ArgType, ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe

INLINE_EVENT_LIMIT = 6
"""Up to this many events are dispatched by an inline `if` chain; more go through a dict."""

UNKNOWN_COMM = "<...>"
IDLE_COMM = "<idle>"

_CHARS = tuple(bytes([b]).decode("utf-8", "surrogateescape") for b in range(256))
_INT_CODES = {
    (size, signed): code.lower() if signed else code
    for size, code in ((1, "B"), (2, "H"), (4, "I"), (8, "Q"))
    for signed in (False, True)
}
_PROBE_CONVERSION = re.compile(r" (?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<conv>\{[^}]*\}|\S+)")


@dataclass(frozen=True)
class _Value:
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
        return _INT_CODES[(self.size, self.signed)] * (self.count or 1)


@dataclass(frozen=True)
class _CompiledEvent:
    format: EventFormat
    event_type: EventType
    values: tuple[_Value, ...]
    ip_field: str | None
    ret_ip_field: str | None


class EventDecoder:
    """Decodes the sub-buffers of one instance into `EventBatch`es.

    `comms` (tid → comm, e.g. `format.parse_saved_cmdlines`) and `tgids` (tid → tgid, from
    `saved_tgids`) name the tasks; a tid without a comm gets the kernel's `<...>`, one without a
    tgid gets pid = tid. Both can be extended while decoding (`update_comms`,
    `update_tgids`). With `strict`, a record of an event the decoder was not given raises;
    otherwise it is counted in `skipped` (by event id) and left out.
    """

    def __init__(
        self,
        layout: SubBufferLayout,
        *,
        comms: Mapping[int, str] | None = None,
        tgids: Mapping[int, int] | None = None,
        strict: bool = True,
    ) -> None:
        self.layout = layout
        self.strict = strict
        self.skipped: dict[int, int] = {}
        self._comms: dict[int, str] = {}
        self._tgids: dict[int, int] = {}
        self._events: dict[int, _CompiledEvent] = {}
        self._reader: SubBufferReader | None = None
        self.update_comms(comms or {})
        self.update_tgids(tgids or {})

    @property
    def event_types(self) -> Mapping[int, EventType]:
        """The EventType of every event added, by event id."""
        return {event_id: event.event_type for event_id, event in self._events.items()}

    @property
    def formats(self) -> Mapping[int, EventFormat]:
        """The format of every event added, by event id."""
        return {event_id: event.format for event_id, event in self._events.items()}

    def update_comms(self, comms: Mapping[int, str]) -> None:
        self._comms.update(comms)
        self._comms[0] = IDLE_COMM

    def update_tgids(self, tgids: Mapping[int, int]) -> None:
        self._tgids.update(tgids)

    def add_event(
        self,
        event_format: EventFormat,
        *,
        probe: ProbeSpec | ResolvedProbe | None = None,
        kind: ProbeKind | None = None,
        group: str | None = None,
        event_type: EventType | None = None,
    ) -> EventType:
        """Teach the decoder one event; returns the EventType its Events will carry.

        `probe` gives the argument types of a dynamic event (the `format` file shows x32 as
        u32 and loses bitfields); without it, probe events take their types from the `print
        fmt` and tracepoints from their fields. `kind` defaults to the probe's kind, else to
        uprobe/uretprobe for probe layouts and tracepoint for the rest.
        """
        spec = probe.spec if isinstance(probe, ResolvedProbe) else probe
        if not isinstance(spec, ProbeSpec):
            spec = None
        if kind is None and probe is not None:
            kind = probe.kind
        group = group or event_format.system or (spec.group_name if spec else None)
        if group is None:
            raise RingBufferFormatError(
                f"event {event_format.name!r}: its group is unknown",
                hint="parse the format with system=GROUP or pass group=",
            )
        _check_common_fields(event_format)
        compiled = _compile_event(event_format, group, spec, kind, event_type)
        if event_format.id in self._events:
            known = self._events[event_format.id].format
            if known != event_format:
                raise RingBufferFormatError(
                    f"event id {event_format.id} is already {known.label!r}, "
                    f"cannot also be {event_format.label!r}"
                )
        self._events[event_format.id] = compiled
        self._reader = None
        return compiled.event_type

    def decode(self, sub_buffer: bytes, cpu: int) -> EventBatch:
        """Decode one sub-buffer read from `per_cpu/cpu<cpu>/trace_pipe_raw`."""
        if self._reader is None:
            self._reader = self._compile()
        if type(sub_buffer) is not bytes:
            sub_buffer = bytes(sub_buffer)
        try:
            events, lost = self._reader(sub_buffer, cpu)
        except (struct.error, IndexError) as error:
            raise RingBufferFormatError(f"cpu {cpu}: malformed sub-buffer: {error}") from None
        return EventBatch(events, lost, cpu)

    def decode_all(self, data: bytes, cpu: int) -> Iterator[EventBatch]:
        """Decode whole sub-buffers saved back to back (one CPU's `trace_pipe_raw`)."""
        for sub_buffer in split_sub_buffers(self.layout, data):
            yield self.decode(sub_buffer, cpu)

    def _compile(self) -> SubBufferReader:
        prefix = self.layout.struct_prefix
        namespace: dict[str, object] = {
            "_new": tuple.__new__,
            "_Event": Event,
            "_chars": _CHARS,
            "_comm": self._comms.get,
            "_tgid": self._tgids.get,
            "_skipped": self.skipped,
            "_unknown": _unknown_event,
            "_short": _short_record,
            "_bad_location": _bad_location,
        }
        type_id = (
            "words[start >> 2] & 0xffff"
            if self.layout.byteorder == "little"
            else "words[start >> 2] >> 16"
        )
        unknown = (
            "_unknown(type_id, start)"
            if self.strict
            else "_skipped[type_id] = _skipped.get(type_id, 0) + 1"
        )
        events = sorted(self._events.values(), key=lambda e: e.format.id)
        for event in events:
            namespace[f"_unpack_{event.format.id}"] = struct.Struct(
                _struct_format(event, prefix)
            ).unpack_from
            namespace[f"_type_{event.format.id}"] = event.event_type
        if len(events) <= INLINE_EVENT_LIMIT:
            setup = f"last_tid = -1\ncomm = {UNKNOWN_COMM!r}\ntgid = -1"
            lines = [f"type_id = {type_id}"]
            for number, event in enumerate(events):
                keyword = "if" if number == 0 else "elif"
                lines.append(f"{keyword} type_id == {event.format.id}:")
                body = _event_body(event, cached_task=True)
                lines += ["    " + line for line in body] + [f"    append({_event_expr(event)})"]
            if events:
                lines += ["else:", "    " + unknown]
            else:
                lines.append(unknown)
            return compile_reader(
                self.layout,
                record_body="\n".join(lines),
                setup=setup,
                namespace=namespace,
                name="decode_sub_buffer",
            )
        handlers: dict[int, object] = {}
        for event in events:
            source = "\n".join(
                [f"def _decode_{event.format.id}(sub_buffer, start, pos, ts, cpu):"]
                + ["    " + line for line in _event_body(event, cached_task=False)]
                + [f"    return {_event_expr(event)}"]
            )
            filename = f"<probescope decoder for {event.format.label}>"
            exec(compile(source, filename, "exec"), namespace)
            handlers[event.format.id] = namespace[f"_decode_{event.format.id}"]
        namespace["_handlers"] = handlers
        dispatch = "\n".join(
            [
                f"type_id = {type_id}",
                "handler = _handlers.get(type_id)",
                "if handler is None:",
                "    " + unknown,
                "else:",
                "    append(handler(sub_buffer, start, pos, ts, cpu))",
            ]
        )
        return compile_reader(
            self.layout, record_body=dispatch, namespace=namespace, name="decode_sub_buffer"
        )


class LiveMerge:
    """Events of a live stream in the order `trace` prints them, across CPUs, as soon as no
    earlier event can still come.

    Fed in the order a reader read the ring buffer: `add` a CPU's decoded sub-buffer, and
    `caught_up` when the reader found that CPU's buffer empty. A CPU's future events are no
    earlier than its last one; after it was caught up, they are also later than everything
    the reader had read from any CPU by then (written before being read). The smallest of
    these bounds is the time up to which `ready()` can release events; `flush()` releases
    all at the end. What is held back is what one reader pass can skew between CPUs.
    """

    def __init__(self, cpus: Iterable[int]) -> None:
        self._pending: dict[int, list[Event]] = {cpu: [] for cpu in cpus}
        self._bound: dict[int, int] = dict.fromkeys(self._pending, -1)
        self._latest = -1

    def add(self, batch: EventBatch) -> None:
        events = batch.events
        if not events:
            return
        cpu = batch.cpu if batch.cpu is not None else -1
        pending = self._pending.get(cpu)
        if pending is None:
            pending = self._pending[cpu] = []
            self._bound[cpu] = -1
        pending += events
        last = events[-1][0]
        if last > self._bound[cpu]:
            self._bound[cpu] = last
        if last > self._latest:
            self._latest = last

    def caught_up(self, cpu: int) -> None:
        if self._latest > self._bound.get(cpu, -1):
            self._bound[cpu] = self._latest

    def ready(self) -> EventBatch:
        """The held events older than every CPU's bound, merged."""
        limit = min(self._bound.values(), default=-1)
        runs = []
        for cpu, pending in self._pending.items():
            if not pending:
                continue
            if pending[-1][0] < limit:
                runs.append(pending)
                self._pending[cpu] = []
                continue
            stop = bisect_left(pending, limit, key=_TIMESTAMP)
            if stop:
                runs.append(pending[:stop])
                del pending[:stop]
        return _merged(runs)

    def flush(self) -> EventBatch:
        runs = [pending for pending in self._pending.values() if pending]
        self._pending = {cpu: [] for cpu in self._pending}
        return _merged(runs)

    @property
    def held(self) -> int:
        return sum(map(len, self._pending.values()))


def _merged(runs: list[list[Event]]) -> EventBatch:
    if not runs:
        return EventBatch([])
    if len(runs) == 1:
        return EventBatch(runs[0])
    return EventBatch(list(heapq.merge(*runs, key=_TIMESTAMP)))


_TIMESTAMP = itemgetter(0)


def merge_cpu_batches(streams: Iterable[Iterable[EventBatch]]) -> Iterator[EventBatch]:
    """Merge per-CPU streams of batches into one stream in the order `trace` prints events:
    by timestamp, ties going to the lower CPU.

    Each stream must be one CPU's batches in time order (what `EventDecoder.decode` gives for
    successive sub-buffers). The result is a sequence of batches, each a run of consecutive
    events of one CPU; a batch's `lost` count rides on the first run taken from it (a loss with
    no events after it comes out as an empty batch). Only the current batch of each CPU is held,
    and a stream is advanced only when its current batch is used up.
    """
    timestamp = itemgetter(0)
    heap: list[tuple[int, int, int]] = []
    current: dict[int, tuple[list[Event], int, int]] = {}
    iterators = [iter(stream) for stream in streams]
    cpus: dict[int, int] = {}

    def load(index: int, carried: int) -> EventBatch | None:
        """Fetch the next non-empty batch of stream `index`; return a lone loss at its end."""
        lost = carried
        for batch in iterators[index]:
            cpus.setdefault(index, batch.cpu if batch.cpu is not None else index)
            lost = _add_lost(lost, batch.lost)
            if batch.events:
                current[index] = (batch.events, 0, lost)
                heapq.heappush(heap, (batch.events[0].timestamp_ns, cpus[index], index))
                return None
        current.pop(index, None)
        if lost:
            return EventBatch([], lost, cpus.get(index))
        return None

    for index in range(len(iterators)):
        lone = load(index, 0)
        if lone is not None:
            yield lone
    while heap:
        _, cpu, index = heapq.heappop(heap)
        events, first, lost = current[index]
        if heap:
            limit_ts, limit_cpu, _ = heap[0]
            find = bisect_right if cpu < limit_cpu else bisect_left
            stop = find(events, limit_ts, first + 1, len(events), key=timestamp)
        else:
            stop = len(events)
        yield EventBatch(events[first:stop] if first or stop < len(events) else events, lost, cpu)
        if stop < len(events):
            current[index] = (events, stop, 0)
            heapq.heappush(heap, (events[stop].timestamp_ns, cpu, index))
        else:
            lone = load(index, 0)
            if lone is not None:
                yield lone


def _add_lost(total: int, lost: int) -> int:
    """Sum loss counts where any unknown count (negative) makes the sum unknown."""
    if total < 0 or lost < 0:
        return -1 if (total or lost) else 0
    return total + lost


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


def _compile_event(
    event_format: EventFormat,
    group: str,
    spec: ProbeSpec | None,
    kind: ProbeKind | None,
    event_type: EventType | None,
) -> _CompiledEvent:
    is_return_layout = event_format.has_field("__probe_ret_ip")
    is_probe_layout = is_return_layout or event_format.has_field("__probe_ip")
    if kind is None:
        if is_probe_layout:
            kind = ProbeKind.URETPROBE if is_return_layout else ProbeKind.UPROBE
        else:
            kind = ProbeKind.TRACEPOINT
    ip_field: str | None = None
    ret_ip_field: str | None = None
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
        if spec is not None:
            typed = tuple((arg.name, arg.type) for arg in spec.args)
        else:
            typed = infer_probe_arg_types(event_format)
        named = tuple(
            (_probe_value(event_format, name, arg_type), arg_type) for name, arg_type in typed
        )
    if event_type is None:
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
    return _CompiledEvent(
        event_format, event_type, tuple(value for value, _ in named), ip_field, ret_ip_field
    )


def _probe_value(event_format: EventFormat, name: str, arg_type: ArgType) -> _Value:
    field = event_format.field(name)
    count = arg_type.count
    if arg_type.base in STRING_TYPES:
        if count == 0 and not field.is_dynamic:
            raise _mismatch(event_format, field, arg_type, "a __data_loc string field")
        expected = 4 * (count or 1)
        if field.size != expected:
            raise _mismatch(event_format, field, arg_type, f"{expected} bytes")
        return _Value(name, field, "string", 4, False, count)
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
    return _Value(name, field, kind, arg_type.size, arg_type.signed and kind == "int", count)


def _mismatch(
    event_format: EventFormat, field: FormatField, arg_type: ArgType, expected: str
) -> RingBufferFormatError:
    return RingBufferFormatError(
        f"format of {event_format.label!r} does not match its probe: field {field.name!r} is "
        f"'{field.type}' of {field.size} bytes, type {arg_type} needs {expected}",
        hint="the event was redefined with other arguments; re-read its format",
    )


def _tracepoint_values(event_format: EventFormat) -> tuple[tuple[_Value, ArgType], ...]:
    result: list[tuple[_Value, ArgType]] = []
    for field in event_format.fields:
        element = field.element_type
        if field.is_dynamic:
            if element.endswith("char"):
                value = _Value(field.name, field, "string", 4)
                arg_type = ArgType(field.type, "string", 4, False)
            else:
                value = _Value(field.name, field, "bytes")
                arg_type = ArgType(field.type, "bytes", field.size, False)
        elif field.is_array:
            length = field.array_length
            if element in ("char", "signed char", "unsigned char") and field.size == (length or 0):
                value = _Value(field.name, field, "bytes")
                arg_type = ArgType(f"{element}[{length}]", "string", field.size, False)
            elif length and field.size % length == 0 and field.size // length in (1, 2, 4, 8):
                size = field.size // length
                value = _Value(field.name, field, "int", size, field.signed, length)
                arg_type = _int_type(field.type, size, field.signed, length)
            else:
                value = _Value(field.name, field, "bytes")
                arg_type = ArgType(field.type, "bytes", field.size, False)
        elif field.size in (1, 2, 4, 8):
            value = _Value(field.name, field, "int", field.size, field.signed)
            arg_type = _int_type(field.type, field.size, field.signed, 0)
        else:
            value = _Value(field.name, field, "bytes")
            arg_type = ArgType(field.type, "bytes", field.size, False)
        result.append((value, arg_type))
    return tuple(result)


def _int_type(name: str, size: int, signed: bool, count: int) -> ArgType:
    base = f"{'s' if signed else 'u'}{size * 8}"
    return ArgType(name, base, size, signed, count=count)


def _check_common_fields(event_format: EventFormat) -> None:
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


def _struct_format(event: _CompiledEvent, prefix: str) -> str:
    fmt = event.format
    head = [fmt.field("common_flags"), fmt.field("common_preempt_count"), fmt.field("common_pid")]
    for name in (event.ip_field, event.ret_ip_field):
        if name:
            head.append(fmt.field(name))
    parts: list[tuple[FormatField, str]] = [(f, _int_code(f)) for f in head]
    parts += [(value.field, value.struct_codes()) for value in event.values]
    codes = [prefix]
    cursor = 0
    for field, code in parts:
        if field.offset < cursor:
            raise RingBufferFormatError(
                f"event {fmt.label!r}: field {field.name!r} at offset {field.offset} overlaps "
                "the field before it"
            )
        if field.offset > cursor:
            codes.append(f"{field.offset - cursor}x")
        codes.append(code)
        cursor = field.end
    return "".join(codes)


def _int_code(field: FormatField) -> str:
    code = _INT_CODES.get((field.size, field.signed))
    if code is None:
        raise RingBufferFormatError(
            f"field {field.name!r} of {field.size} bytes is not an integer the decoder reads"
        )
    return code


def _event_body(event: _CompiledEvent, *, cached_task: bool) -> list[str]:
    """Statements that unpack one record into local names (flags, preempt, tid, ip, ...)."""
    fmt = event.format
    event_id = fmt.id
    names = ["flags", "preempt", "tid"]
    if event.ip_field:
        names.append("ip")
    if event.ret_ip_field:
        names.append("ret_ip")
    arg_names: list[str] = []
    for index, value in enumerate(event.values):
        if value.count:
            elements = [f"a{index}_{n}" for n in range(value.count)]
            names += elements
        else:
            names.append(f"a{index}")
        arg_names.append(f"a{index}")
    lines = [
        f"if pos - start < {fmt.fixed_size}:",
        f"    _short(start, pos - start, {fmt.fixed_size}, {fmt.label!r})",
        f"{', '.join(names)}, = _unpack_{event_id}(sub_buffer, start)",
    ]
    if cached_task:
        lines += [
            "if tid != last_tid:",
            "    last_tid = tid",
            f"    comm = _comm(tid, {UNKNOWN_COMM!r})",
            "    tgid = _tgid(tid, tid)",
        ]
    else:
        lines += [f"comm = _comm(tid, {UNKNOWN_COMM!r})", "tgid = _tgid(tid, tid)"]
    for index, value in enumerate(event.values):
        lines += _value_lines(value, f"a{index}", fmt.label)
    return lines


def _value_lines(value: _Value, var: str, label: str) -> list[str]:
    if value.kind == "int":
        if value.count:
            return [f"{var} = ({', '.join(f'{var}_{n}' for n in range(value.count))},)"]
        return []
    if value.kind == "char":
        if value.count:
            return [f"{var} = ({', '.join(f'_chars[{var}_{n}]' for n in range(value.count))},)"]
        return [f"{var} = _chars[{var}]"]
    if value.kind == "bytes":
        if value.field.size == 0:
            # `T name[]` of size 0 ends the record: it holds whatever the record has left
            # (ftrace's function arguments, kernel_stack's callers).
            return [f"{var} = sub_buffer[start + {value.field.offset}:pos]"]
        if value.field.is_array and value.field.element_type.endswith("char"):
            return [f"{var} = {var}.split(b'\\0', 1)[0].decode('utf-8', 'surrogateescape')"]
        if value.field.is_dynamic:
            return _location_lines(value, var, var, label, as_text=False)
        return []
    if value.count:
        lines: list[str] = []
        for n in range(value.count):
            lines += _location_lines(value, f"{var}_{n}", f"{var}_{n}", label, as_text=True)
        lines.append(f"{var} = ({', '.join(f'{var}_{n}' for n in range(value.count))},)")
        return lines
    return _location_lines(value, var, var, label, as_text=True)


def _location_lines(
    value: _Value, source: str, target: str, label: str, *, as_text: bool
) -> list[str]:
    """Resolve a `__data_loc`/`__rel_loc` word into the bytes it points at."""
    field = value.field
    base = f"start + {field.end}" if field.is_rel_loc else "start"
    if as_text:
        take = "sub_buffer[at:at + length - 1].decode('utf-8', 'surrogateescape')"
        empty = "None"
    else:
        take = "sub_buffer[at:at + length]"
        empty = "b''"
    return [
        f"length = {source} >> 16",
        "if length:",
        f"    at = {base} + ({source} & 0xffff)",
        "    if at + length > pos:",
        f"        _bad_location(start, {field.name!r}, at, length, pos, {label!r})",
        f"    {target} = {take}",
        "else:",
        f"    {target} = {empty}",
    ]


def _event_expr(event: _CompiledEvent) -> str:
    args = "".join(f"a{index}, " for index in range(len(event.values)))
    ip = "ip" if event.ip_field else "0"
    ret_ip = "ret_ip" if event.ret_ip_field else "None"
    return (
        f"_new(_Event, (ts, cpu, tgid, tid, comm, _type_{event.format.id}, {ip}, {ret_ip}, "
        f"({args}), flags, preempt))"
    )


def _unknown_event(type_id: int, start: int) -> None:
    raise RingBufferFormatError(
        f"record at offset {start} is of event id {type_id}, which the decoder was not given",
        hint="add the format of every event enabled in the instance, or decode with strict=False",
    )


def _short_record(start: int, length: int, needed: int, label: str) -> None:
    raise RingBufferFormatError(
        f"record of {label!r} at offset {start} has {length} bytes, its format needs {needed}"
    )


def _bad_location(start: int, name: str, at: int, length: int, pos: int, label: str) -> None:
    raise RingBufferFormatError(
        f"record of {label!r} at offset {start}: field {name!r} points at {length} bytes at "
        f"offset {at}, past the record's end at {pos}"
    )
