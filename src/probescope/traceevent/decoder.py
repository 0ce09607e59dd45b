"""Ring-buffer records to `Event`s: one compiled decoder per tracefs instance (or recording).

Each event's `EventLayout` (see `event_layout`) is turned once into a `struct` layout and a few
lines of Python that build the `Event`; those lines are spliced into the sub-buffer walk of
`ringbuffer.compile_reader`, so decoding a record costs one `struct` unpack, a tuple and no
parsing. Argument values follow the probe's types: integers for u/s/x types (the kernel stores
bitfields already extracted), a one-character `str` for `char`, `str` or None (the kernel's
`(fault)`) for strings, tuples for arrays. Event strings are decoded as UTF-8 with undecodable
bytes kept as surrogate escapes, so `s.encode("utf-8", "surrogateescape")` gives back the
kernel's bytes. `merge.merge_cpu_batches` then puts the per-CPU batch streams in the order the
kernel's `trace` file prints them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping

from probescope.errors import RingBufferFormatError
from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ProbeKind, ProbeSpec
from probescope.language.resolved import ResolvedProbe
from probescope.traceevent.context import KernelContext
from probescope.traceevent.event_layout import (
    INT_CODES,
    EventLayout,
    FieldValue,
    check_common_fields,
    event_layout,
)
from probescope.traceevent.format import EventFormat, FormatField
from probescope.traceevent.ringbuffer import (
    SubBufferLayout,
    SubBufferReader,
    compile_reader,
    split_sub_buffers,
)

INLINE_EVENT_LIMIT = 6
"""Up to this many events are dispatched by an inline `if` chain; more go through a dict."""

UNKNOWN_COMM = "<...>"
IDLE_COMM = "<idle>"

_CHARS = tuple(bytes([b]).decode("utf-8", "surrogateescape") for b in range(256))


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
        self._events: dict[int, EventLayout] = {}
        self._reader: SubBufferReader | None = None
        self._handlers: dict[int, Callable[..., Event]] | None = None
        self.update_comms(comms or {})
        self.update_tgids(tgids or {})

    @classmethod
    def from_context(
        cls, context: KernelContext, *, strict: bool = True, sub_buffer_size: int | None = None
    ) -> EventDecoder:
        """A decoder of the sub-buffers of the kernel `context` describes: its layout, the
        tasks it named, and every event format it holds (probe arguments typed from their
        print fmt; `add_event` with a probe types them exactly)."""
        decoder = cls(
            context.layout(sub_buffer_size),
            comms=context.comms,
            tgids=context.tgids,
            strict=strict,
        )
        for event_format in context.formats:
            decoder.add_event(event_format)
        return decoder

    @property
    def event_types(self) -> Mapping[int, EventType]:
        """The EventType of every event added, by event id."""
        return {event_id: event.event_type for event_id, event in self._events.items()}

    @property
    def formats(self) -> tuple[EventFormat, ...]:
        """The format of every event added, in event id order."""
        return tuple(self._events[event_id].format for event_id in sorted(self._events))

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
        check_common_fields(event_format)
        compiled = event_layout(event_format, group, spec, kind, event_type)
        if event_format.id in self._events:
            known = self._events[event_format.id].format
            if known != event_format:
                raise RingBufferFormatError(
                    f"event id {event_format.id} is already {known.label!r}, "
                    f"cannot also be {event_format.label!r}"
                )
        self._events[event_format.id] = compiled
        self._reader = None
        self._handlers = None
        return compiled.event_type

    def layout_of(self, event_id: int) -> EventLayout | None:
        """What the decoder reads of `event_id`'s records, or None for an event not given."""
        return self._events.get(event_id)

    def comm(self, tid: int) -> str:
        """The comm records of `tid` carry (`<...>` when unknown, `<idle>` for 0)."""
        return self._comms.get(tid, UNKNOWN_COMM)

    def decode_record(self, sub_buffer: bytes, start: int, pos: int, ts: int, cpu: int) -> Event:
        """The Event of one record whose payload is `sub_buffer[start:pos]`, at time `ts` —
        decoded by the same compiled code `decode` runs for a whole sub-buffer."""
        if self._handlers is None:
            self._handlers = self._compile_handlers(self._namespace())
        order = self.layout.byteorder
        type_id = int.from_bytes(sub_buffer[start : start + 2], order)
        handler = self._handlers.get(type_id)
        if handler is None:
            _unknown_event(type_id, start)
        try:
            return handler(sub_buffer, start, pos, ts, cpu)  # type: ignore[misc]
        except (struct.error, IndexError) as error:
            raise RingBufferFormatError(f"cpu {cpu}: malformed sub-buffer: {error}") from None

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

    def _namespace(self) -> dict[str, object]:
        """The globals of the compiled decoding code: helpers, and per event its unpacker and
        EventType."""
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
        for event in sorted(self._events.values(), key=lambda e: e.format.id):
            namespace[f"_unpack_{event.format.id}"] = struct.Struct(
                _struct_format(event, prefix)
            ).unpack_from
            namespace[f"_type_{event.format.id}"] = event.event_type
        return namespace

    def _compile_handlers(self, namespace: dict[str, object]) -> dict[int, Callable[..., Event]]:
        """One function per event: `(sub_buffer, start, pos, ts, cpu) -> Event`."""
        handlers: dict[int, Callable[..., Event]] = {}
        for event in sorted(self._events.values(), key=lambda e: e.format.id):
            source = "\n".join(
                [f"def _decode_{event.format.id}(sub_buffer, start, pos, ts, cpu):"]
                + ["    " + line for line in _event_body(event, cached_task=False)]
                + [f"    return {_event_expr(event)}"]
            )
            filename = f"<probescope decoder for {event.format.label}>"
            exec(compile(source, filename, "exec"), namespace)
            handlers[event.format.id] = namespace[f"_decode_{event.format.id}"]  # type: ignore[assignment]
        return handlers

    def _compile(self) -> SubBufferReader:
        namespace = self._namespace()
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
        namespace["_handlers"] = self._compile_handlers(namespace)
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


def _struct_format(event: EventLayout, prefix: str) -> str:
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
    code = INT_CODES.get((field.size, field.signed))
    if code is None:
        raise RingBufferFormatError(
            f"field {field.name!r} of {field.size} bytes is not an integer the decoder reads"
        )
    return code


def _event_body(event: EventLayout, *, cached_task: bool) -> list[str]:
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


def _value_lines(value: FieldValue, var: str, label: str) -> list[str]:
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
    value: FieldValue, source: str, target: str, label: str, *, as_text: bool
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


def _event_expr(event: EventLayout) -> str:
    """The expression that builds the record's Event as a plain tuple (no keyword handling),
    its fields in the order `Event._fields` gives them, from the locals of `_event_body`."""
    args = "".join(f"a{index}, " for index in range(len(event.values)))
    sources = {
        "timestamp_ns": "ts",
        "cpu": "cpu",
        "pid": "tgid",
        "tid": "tid",
        "comm": "comm",
        "type": f"_type_{event.format.id}",
        "ip": "ip" if event.ip_field else "0",
        "ret_ip": "ret_ip" if event.ret_ip_field else "None",
        "args": f"({args})",
        "flags": "flags",
        "preempt_count": "preempt",
    }
    return f"_new(_Event, ({', '.join(sources[name] for name in Event._fields)},))"


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
