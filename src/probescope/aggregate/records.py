"""The fast path: counts and histograms straight from ring-buffer sub-buffers, no Event per hit.

For the tracefs engine the records themselves are aggregated. Each record is reduced to a raw
key — the fixed fields the aggregation needs (event id, thread id, arguments), unpacked with
one `struct` — and raw keys are counted; they become real keys (probe names, pids and comms,
histogram buckets) only when a snapshot is taken, so min, max and sum stay exact.

A sub-buffer of a busy probe is usually a run of records of one size with nothing between
them: its header bytes are checked with one `bytes.translate` over a strided slice, and then
`struct.iter_unpack` and `Counter.update` count the whole run in C. Other sub-buffers (time
extensions, records of several sizes, large records) take the compiled per-record walk of
`ringbuffer.compile_reader`, which yields the same raw keys. Keys holding `pid` or `comm` name
each thread the first time it is seen (`task_of`), as the decoder does. Stacks and latency
need whole events and take the Event path (`aggregators`, `latency`).
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from probescope.aggregate.aggregators import is_stack_record
from probescope.aggregate.keys import STACK_FIELDS, KeyPlan, probe_label
from probescope.aggregate.maps import AggregateMap, Aggregation, Key
from probescope.aggregate.values import LOG2, Count, Histogram, Scale, Value
from probescope.errors import RingBufferFormatError
from probescope.events import HIDDEN_PREFIX, EventType
from probescope.traceevent.format import EventFormat
from probescope.traceevent.ringbuffer import SubBufferLayout, compile_reader, read_header

FAST_FIELDS = frozenset({"probe", "pid", "tid", "cpu", "comm", "retval"})
_INT_CODES = {(1, False): "B", (2, False): "H", (4, False): "I", (8, False): "Q"}
_INT_CODES.update({(size, True): code.lower() for (size, _), code in list(_INT_CODES.items())})
_TYPE_LEN = bytes(b & 0x1F for b in range(256))
"""Maps a little-endian record header's first byte to its type_len."""
MAX_SMALL = 28
INLINE_EVENTS = 8
"""Up to this many events are told apart by an `if` chain in the record walk."""
FOLD_AT = 200_000
"""Distinct raw keys held before they are turned into values."""

TaskOf = Callable[[int], tuple[str, int]]
"""`task_of(tid)` → (comm, tgid) of a thread, as the engine names it."""


class RawSubBufferSource(Protocol):
    """An engine that can hand out the raw sub-buffers it records (the tracefs engine)."""

    def sub_buffers(self) -> Iterator[tuple[int, bytes] | None]: ...

    def record_layout(self) -> tuple[SubBufferLayout, dict[int, tuple[EventFormat, EventType]]]: ...

    def task_of(self, tid: int) -> tuple[str, int]: ...


def fast_path_possible(plan: KeyPlan, event_types: list[EventType], of: str | None) -> bool:
    """Whether every key field and the value can be read from fixed record fields."""
    if any(field in STACK_FIELDS for field in plan.fields):
        return False
    for event_type in event_types:
        numeric = {
            name
            for name, arg_type in zip(event_type.arg_names, event_type.arg_types, strict=True)
            if not arg_type.is_string and not arg_type.count and arg_type.size in (1, 2, 4, 8)
        }
        if event_type.format is None and event_type.kind.value == "tracepoint":
            return False
        for field in plan.fields:
            if (
                field not in FAST_FIELDS
                and field not in numeric
                and any(field in t.arg_names for t in event_types)
            ):
                return False
        if of is not None and of in event_type.arg_names and of not in numeric:
            return False
    return True


@dataclass(frozen=True)
class _RawLayout:
    """How one event's records become raw keys: (event id, [tid], fields...) in offset order."""

    event_id: int
    names: tuple[str, ...]  # "type", "tid", then argument names, in the struct's order
    unpack: Callable[[bytes, int], tuple[Any, ...]]  # payload-relative
    size: int  # payload bytes the unpack reads
    run: struct.Struct | None  # whole records (header included) of a uniform run
    record_size: int  # bytes of one whole record, 0 when records vary or are large


class RecordAggregator:
    """Counts (`of` None) or histograms of `of` per key, fed with raw sub-buffers."""

    def __init__(
        self,
        name: str,
        plan: KeyPlan,
        layout: SubBufferLayout,
        events: Mapping[int, tuple[EventFormat, EventType]],
        *,
        of: str | None = None,
        scale: Scale | None = None,
        retval_arg: str | None = None,
        task_of: TaskOf | None = None,
    ) -> None:
        self.name = name
        self.plan = plan
        self.of = of
        self.scale = scale
        self.retval_arg = retval_arg
        self.task_of = task_of or (lambda tid: ("<...>", tid))
        self.by_cpu = "cpu" in plan.fields
        self.counts: dict[int, Counter[tuple[Any, ...]]] = {}
        self.tasks: dict[int, tuple[str, int]] = {}
        self.result = Aggregation()
        self._folded: dict[Key, Value] = {}
        self.uniform_runs = 0
        self.walked = 0
        self._little = layout.byteorder == "little"
        self._layout = layout
        self._types = {i: t for i, (_, t) in events.items() if not is_stack_record(t)}
        self._formats = {i: f for i, (f, _) in events.items()}
        self.ids: dict[int, dict[int, int]] = {}  # event id counts, when keys need no more
        self._raw = {
            i: self._raw_layout(f, t) for i, (f, t) in events.items() if not is_stack_record(t)
        }
        self._shared = self._shared_runs()
        self._reader = self._compile(layout)

    # -- raw keys -------------------------------------------------------------------------

    def _needs_tid(self) -> bool:
        return any(f in ("pid", "comm", "tid") for f in self.plan.fields)

    def _argument_names(self, event_type: EventType) -> list[str]:
        wanted = []
        for field in self.plan.fields:
            name = self.retval_arg if field == "retval" else field
            if name is not None and name not in FAST_FIELDS and name in event_type.arg_names:
                wanted.append(name)
        if self.of is not None and self.of in event_type.arg_names:
            wanted.append(self.of)
        return list(dict.fromkeys(wanted))

    def _raw_layout(self, event_format: EventFormat, event_type: EventType) -> _RawLayout:
        prefix = self._layout.struct_prefix
        fields: list[tuple[str, int, str]] = [("type", 0, "H")]
        if self._needs_tid():
            pid = event_format.field("common_pid")
            fields.append(("tid", pid.offset, _code(pid.size, True)))
        for name in self._argument_names(event_type):
            index = event_type.arg_names.index(name)
            arg_type = event_type.arg_types[index]
            field = event_format.field(name)
            signed = arg_type.signed if arg_type.base[:1] in "usx" else field.signed
            fields.append((name, field.offset, _code(field.size, signed)))
        fields.sort(key=lambda f: f[1])
        codes, cursor = [], 0
        for _, offset, code in fields:
            if offset < cursor:
                raise RingBufferFormatError(f"event {event_format.label!r}: fields overlap")
            if offset > cursor:
                codes.append(f"{offset - cursor}x")
            codes.append(code)
            cursor = offset + struct.calcsize(prefix + code)
        payload = struct.Struct(prefix + "".join(codes))
        record_size = 0
        run = None
        dynamic = any(f.is_dynamic for f in event_format.fields)
        padded = -(-max((f.end for f in event_format.all_fields), default=0) // 4) * 4
        if not dynamic and 0 < padded <= 4 * MAX_SMALL and self._little:
            record_size = 4 + padded
            tail = record_size - 4 - payload.size
            run = struct.Struct(prefix + "4x" + "".join(codes) + (f"{tail}x" if tail else ""))
        return _RawLayout(
            event_id=event_format.id,
            names=tuple(name for name, _, _ in fields),
            unpack=payload.unpack_from,
            size=payload.size,
            run=run,
            record_size=record_size,
        )

    def _shared_runs(self) -> dict[int, struct.Struct]:
        """Per record size, a struct that serves every event of that size — when the raw key
        holds no argument (only the event id and thread id), records of different events can
        share one uniform run."""
        shared: dict[int, struct.Struct] = {}
        by_size: dict[int, list[_RawLayout]] = {}
        for raw in self._raw.values():
            if raw.run is not None:
                by_size.setdefault(raw.record_size, []).append(raw)
        for size, layouts in by_size.items():
            names = {raw.names for raw in layouts}
            formats = {raw.run.format for raw in layouts if raw.run is not None}
            if len(names) == 1 and len(formats) == 1 and set(next(iter(names))) <= {"type", "tid"}:
                shared[size] = layouts[0].run  # type: ignore[assignment]
        return shared

    def _compile(self, layout: SubBufferLayout) -> Callable[[bytes, int], tuple[list[Any], int]]:
        """The record-by-record walk for sub-buffers that are not one uniform run. Keys of
        event ids alone count the ids themselves; ids and thread ids read two words; anything
        else unpacks the event's raw layout (an `if` chain for a few events, a dict beyond)."""
        little = layout.byteorder == "little"
        type_id = "words[start >> 2] & 0xffff" if little else "words[start >> 2] >> 16"
        names = {raw.names for raw in self._raw.values()}
        namespace: dict[str, object] = {
            "_short": _short_record,
            "_counts_for": self._counts_for,
            "_ids_for": self._ids_for,
        }
        setup = "skipped = 0\ncounts = _counts_for(cpu)"
        if names <= {("type",)}:
            setup = "ids = _ids_for(cpu)"
            body = f"t = {type_id}\nids[t] = ids.get(t, 0) + 1"
        elif names == {("type", "tid")} and little and self._tid_is_second_word():
            body = f"k = ({type_id}, words[(start >> 2) + 1])\ncounts[k] = counts.get(k, 0) + 1"
        elif len(self._raw) <= INLINE_EVENTS:
            lines = [f"t = {type_id}"]
            keyword = "if"
            for event_id, raw in sorted(self._raw.items()):
                namespace[f"_unpack_{event_id}"] = raw.unpack
                lines += [
                    f"{keyword} t == {event_id}:",
                    f"    if pos - start < {raw.size}:",
                    f"        _short(t, start, pos - start, {raw.size})",
                    f"    k = _unpack_{event_id}(sub_buffer, start)",
                ]
                keyword = "elif"
            lines += ["else:", "    skipped += 1", "    continue"] if self._raw else ["continue"]
            lines.append("counts[k] = counts.get(k, 0) + 1")
            body = "\n".join(lines)
        else:
            namespace["_raw"] = {i: (r.unpack, r.size) for i, r in self._raw.items()}.get
            body = f"""\
entry = _raw(t := {type_id})
if entry is None:
    skipped += 1
    continue
if pos - start < entry[1]:
    _short(t, start, pos - start, entry[1])
k = entry[0](sub_buffer, start)
counts[k] = counts.get(k, 0) + 1
"""
        return compile_reader(
            layout, record_body=body, setup=setup, namespace=namespace, name="aggregate_records"
        )

    def _tid_is_second_word(self) -> bool:
        """common_pid is the 4 bytes at offset 4 of every record (it is, on Linux)."""
        return all(
            self._formats[i].field("common_pid").offset == 4
            and self._formats[i].field("common_pid").size == 4
            for i in self._raw
        )

    def _ids_for(self, cpu: int) -> dict[int, int]:
        key = cpu if self.by_cpu else -1
        ids = self.ids.get(key)
        if ids is None:
            ids = self.ids[key] = {}
        return ids

    def _counts_for(self, cpu: int) -> Counter[tuple[Any, ...]]:
        key = cpu if self.by_cpu else -1
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = Counter()
        return counts

    # -- feeding --------------------------------------------------------------------------

    def feed(self, sub_buffer: bytes, cpu: int) -> int:
        """Aggregate one sub-buffer; returns the events the kernel lost before it."""
        try:
            lost = self._uniform_run(sub_buffer, cpu)
            if lost is None:
                self.walked += 1
                _, lost = self._reader(sub_buffer, cpu)
        except (struct.error, IndexError) as error:
            raise RingBufferFormatError(f"cpu {cpu}: malformed sub-buffer: {error}") from None
        if lost:
            self.result.count("lost events", max(lost, 0))
        if self.of is not None and sum(map(len, self.counts.values())) > FOLD_AT:
            self._fold()
        return lost

    def _uniform_run(self, sub_buffer: bytes, cpu: int) -> int | None:
        """Count a sub-buffer made of one run of same-size small records in C; None when it
        is not one (the caller walks it record by record)."""
        layout = self._layout
        start = layout.data_offset
        if not self._little or len(sub_buffer) <= start:
            return None
        header = read_header(layout, sub_buffer)
        type_len = sub_buffer[start] & 0x1F
        if not 0 < type_len <= MAX_SMALL:
            return None
        record = 4 + 4 * type_len
        count, rest = divmod(header.size, record)
        if count == 0 or rest:
            return None
        end = start + count * record
        if sub_buffer[start:end:record].translate(_TYPE_LEN) != bytes((type_len,)) * count:
            return None
        run = self._shared.get(record)
        if run is None:
            low = sub_buffer[start + 4 : end : record]
            high = sub_buffer[start + 5 : end : record]
            if low.count(low[0]) != count or high.count(high[0]) != count:
                return None
            raw = self._raw.get(low[0] | high[0] << 8)
            if raw is None or raw.run is None or raw.record_size != record:
                return None
            run = raw.run
        self._counts_for(cpu).update(run.iter_unpack(memoryview(sub_buffer)[start:end]))
        self.uniform_runs += 1
        return header.lost

    # -- results --------------------------------------------------------------------------

    def _task(self, tid: int) -> tuple[str, int]:
        task = self.tasks.get(tid)
        if task is None:
            task = self.tasks[tid] = self.task_of(tid)
        return task

    def _key_of(self, event_id: int) -> Callable[[tuple[Any, ...], int], tuple[Key, Any]] | None:
        raw = self._raw.get(event_id)
        event_type = self._types.get(event_id)
        if raw is None or event_type is None:
            return None
        label = probe_label(event_type)
        position = {name: i for i, name in enumerate(raw.names)}
        value_at = position.get(self.of) if self.of is not None else None
        tid_at = position.get("tid", 0)
        getters: list[Callable[[tuple[Any, ...], int], Any]] = []
        for field in self.plan.fields:
            name = self.retval_arg if field == "retval" else field
            getters.append(self._getter(field, label, tid_at, position.get(name or "")))

        def key_of(raw_key: tuple[Any, ...], cpu: int) -> tuple[Key, Any]:
            value = raw_key[value_at] if value_at is not None else None
            return tuple(get(raw_key, cpu) for get in getters), value

        return key_of

    def _fold(self) -> None:
        """Raw keys into values, so distinct raw keys (a histogram of pointers) stay bounded."""
        self._convert(self._folded, self.result)
        self.counts.clear()

    def _getter(
        self, field: str, label: str, tid_at: int, at: int | None
    ) -> Callable[[tuple[Any, ...], int], Any]:
        """The function giving key part `field` of a raw key seen on a cpu."""
        if field == "probe":
            return lambda raw, cpu: label
        if field == "cpu":
            return lambda raw, cpu: cpu
        if field == "tid":
            return lambda raw, cpu: raw[tid_at]
        if field == "pid":
            return lambda raw, cpu: self._task(raw[tid_at])[1]
        if field == "comm":
            return lambda raw, cpu: self._task(raw[tid_at])[0]
        if at is None:
            return lambda raw, cpu: None
        return lambda raw, cpu: raw[at]

    def snapshot(self) -> Aggregation:
        result = self.result.copy()
        values = {key: value.copy() for key, value in self._folded.items()}
        self._convert(values, result)
        result.maps.insert(0, AggregateMap(self.name, self.plan.fields, values))
        return result

    def _convert(self, values: dict[Key, Value], result: Aggregation) -> None:
        converters: dict[int, Callable[[tuple[Any, ...], int], tuple[Key, Any]] | None] = {}
        for cpu, ids in self.ids.items():
            counts = self._counts_for(cpu)
            for event_id, times in ids.items():
                counts[(event_id,)] += times
            ids.clear()
        for cpu, counts in self.counts.items():
            for raw_key, times in counts.items():
                event_id = raw_key[0]
                if event_id not in converters:
                    converters[event_id] = self._key_of(event_id)
                convert = converters[event_id]
                if convert is None:
                    continue
                key, value = convert(raw_key, cpu)
                found = values.get(key)
                if self.of is None:
                    if isinstance(found, Count):
                        found.value += times
                    else:
                        values[key] = Count(times)
                elif value is not None:
                    if not isinstance(found, Histogram):
                        found = values[key] = Histogram(self.scale or LOG2)
                    found.add(value, times)
                else:
                    shown = (self.of or "").removeprefix(HIDDEN_PREFIX)
                    result.count(f"events without argument {shown}", times)

    def clear(self) -> None:
        self.counts.clear()
        self.ids.clear()
        self._folded.clear()
        self.result = Aggregation()


def _code(size: int, signed: bool) -> str:
    code = _INT_CODES.get((size, signed))
    if code is None:
        raise RingBufferFormatError(f"a field of {size} bytes is not an integer to aggregate")
    return code


def _short_record(event_id: int, start: int, length: int, needed: int) -> None:
    raise RingBufferFormatError(
        f"record of event id {event_id} at offset {start} has {length} bytes, "
        f"the aggregation reads {needed}"
    )
