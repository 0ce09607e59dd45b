"""The fast path: counts and histograms straight from ring-buffer sub-buffers, no Event per hit.

For the tracefs engine the records themselves are aggregated: the sub-buffer walk of
`ringbuffer.compile_reader` gets, per event id, a few spliced lines that unpack only the
fields the key and the value need and update a dict. A count by probe is one dict update per
record; a histogram counts (key, value) pairs and turns them into buckets when a snapshot is
taken, so min, max and sum stay exact. Keys holding `pid` or `comm` name each thread the first
time it is seen (`task_of`), as the decoder does. Stacks and latency need whole events and
take the Event path (`aggregators`, `latency`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from probescope.aggregate.aggregators import is_stack_record
from probescope.aggregate.keys import STACK_FIELDS, KeyPlan, probe_label
from probescope.aggregate.maps import AggregateMap, Aggregation, Key
from probescope.aggregate.values import Count, Histogram, Scale, Value
from probescope.engines.tracefs.format import EventFormat
from probescope.engines.tracefs.ringbuffer import SubBufferLayout, compile_reader
from probescope.errors import RingBufferFormatError
from probescope.events import EventType

FAST_FIELDS = frozenset({"probe", "pid", "tid", "cpu", "comm", "retval"})
_INT_CODES = {(1, False): "B", (2, False): "H", (4, False): "I", (8, False): "Q"}
_INT_CODES.update({(size, True): code.lower() for (size, _), code in list(_INT_CODES.items())})
FOLD_AT = 200_000
"""Distinct (key, value) pairs held before they are folded into histograms."""

TaskOf = Callable[[int], tuple[str, int]]
"""`task_of(tid)` → (comm, tgid) of a thread, as the engine names it."""


class RawSubBufferSource(Protocol):
    """An engine that can hand out the raw sub-buffers it records (the tracefs engine)."""

    def sub_buffers(self) -> Iterator[tuple[int, bytes] | None]: ...

    def record_layout(self) -> tuple[SubBufferLayout, dict[int, tuple[EventFormat, EventType]]]:
        ...

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
        self.task_of = task_of or (lambda tid: ("<...>", tid))
        self.counts: dict[Any, int] = {}
        self.tasks: dict[int, tuple[str, int]] = {}
        self.histograms: dict[Key, Histogram] = {}
        self.result = Aggregation()
        self.skipped = 0
        self._reader = self._compile(layout, events, retval_arg)

    # -- compilation ----------------------------------------------------------------------

    def _compile(
        self,
        layout: SubBufferLayout,
        events: Mapping[int, tuple[EventFormat, EventType]],
        retval_arg: str | None,
    ) -> Callable[[bytes, int], tuple[list[object], int]]:
        prefix = layout.struct_prefix
        namespace: dict[str, object] = {
            "_counts": self.counts,
            "_tasks": self.tasks,
            "_first": self._first_sight,
        }
        type_id = (
            "words[start >> 2] & 0xffff"
            if layout.byteorder == "little"
            else "words[start >> 2] >> 16"
        )
        needs_task = any(f in ("pid", "comm") for f in self.plan.fields)
        needs_tid = needs_task or "tid" in self.plan.fields
        lines = [f"type_id = {type_id}"]
        keyword = "if"
        for event_id, (event_format, event_type) in sorted(events.items()):
            if is_stack_record(event_type):
                continue
            body = self._event_lines(
                event_format, event_type, prefix, namespace, retval_arg, needs_tid, needs_task
            )
            if body is None:
                continue
            lines.append(f"{keyword} type_id == {event_id}:")
            lines += ["    " + line for line in body]
            keyword = "elif"
        if keyword == "elif":
            lines += ["else:", "    skipped += 1"]
        else:
            lines.append("skipped += 1")
        source = "\n".join(lines)
        reader = compile_reader(
            layout,
            record_body=source,
            setup="skipped = 0",
            namespace=namespace,
            name="aggregate_sub_buffer",
        )
        return reader

    def _event_lines(
        self,
        event_format: EventFormat,
        event_type: EventType,
        prefix: str,
        namespace: dict[str, object],
        retval_arg: str | None,
        needs_tid: bool,
        needs_task: bool,
    ) -> list[str] | None:
        event_id = event_format.id
        reads: list[tuple[str, int, str]] = []  # (local name, offset, struct code)
        if needs_tid:
            pid = event_format.field("common_pid")
            reads.append(("tid", pid.offset, _code(pid.size, True)))
        parts: list[str] = []
        for field in self.plan.fields:
            if field == "probe":
                namespace[f"_label_{event_id}"] = probe_label(event_type)
                parts.append(f"_label_{event_id}")
            elif field == "tid":
                parts.append("tid")
            elif field == "pid":
                parts.append("task[1]")
            elif field == "comm":
                parts.append("task[0]")
            elif field == "cpu":
                parts.append("cpu")
            else:
                name = retval_arg if field == "retval" else field
                local = self._argument(event_format, event_type, name, reads)
                parts.append(local or "None")
        value_local = None
        if self.of is not None:
            value_local = self._argument(event_format, event_type, self.of, reads)
            if value_local is None:
                return None
        lines = []
        if reads:
            reads.sort(key=lambda read: read[1])
            layout_codes = [prefix]
            cursor = 0
            names = []
            for local, offset, code in reads:
                if offset < cursor:
                    continue
                if offset > cursor:
                    layout_codes.append(f"{offset - cursor}x")
                layout_codes.append(code)
                cursor = offset + struct.calcsize(prefix + code)
                names.append(local)
            unpack = struct.Struct("".join(layout_codes))
            namespace[f"_unpack_{event_id}"] = unpack.unpack_from
            lines.append(f"if pos - start < {unpack.size}:")
            lines.append(f"    _short({event_id}, start, pos - start, {unpack.size})")
            namespace["_short"] = _short_record
            lines.append(f"{', '.join(names)}, = _unpack_{event_id}(sub_buffer, start)")
        if needs_task:
            lines.append("task = _tasks.get(tid)")
            lines.append("if task is None:")
            lines.append("    task = _first(tid)")
        key = ", ".join(parts) + ("," if len(parts) == 1 else "")
        if value_local is not None:
            lines.append(f"key = (({key}), {value_local})")
        elif len(parts) == 1:
            lines.append(f"key = {parts[0]}")
        else:
            lines.append(f"key = ({key})")
        lines.append("_counts[key] = _counts.get(key, 0) + 1")
        return lines

    @staticmethod
    def _argument(
        event_format: EventFormat,
        event_type: EventType,
        name: str | None,
        reads: list[tuple[str, int, str]],
    ) -> str | None:
        if name is None or name not in event_type.arg_names:
            return None
        index = event_type.arg_names.index(name)
        arg_type = event_type.arg_types[index]
        field = event_format.field(name)
        signed = arg_type.signed if arg_type.base[:1] in "usx" else field.signed
        local = f"a{index}"
        if all(read[0] != local for read in reads):
            reads.append((local, field.offset, _code(field.size, signed)))
        return local

    def _first_sight(self, tid: int) -> tuple[str, int]:
        task = self.task_of(tid)
        self.tasks[tid] = task
        return task

    # -- feeding --------------------------------------------------------------------------

    def feed(self, sub_buffer: bytes, cpu: int) -> int:
        """Aggregate one sub-buffer; returns the events the kernel lost before it."""
        try:
            _, lost = self._reader(sub_buffer, cpu)
        except (struct.error, IndexError) as error:
            raise RingBufferFormatError(f"cpu {cpu}: malformed sub-buffer: {error}") from None
        if lost:
            self.result.count("lost events", max(lost, 0))
        if self.of is not None and len(self.counts) > FOLD_AT:
            self._fold()
        return lost

    def _fold(self) -> None:
        """(key, value) pairs into histograms."""
        scale = self.scale
        histograms = self.histograms
        for (key, value), times in self.counts.items():
            histogram = histograms.get(key)
            if histogram is None:
                histogram = histograms[key] = Histogram(scale) if scale else Histogram()
            histogram.add(value, times)
        self.counts.clear()

    # -- results --------------------------------------------------------------------------

    def snapshot(self) -> Aggregation:
        result = self.result.copy()
        if self.of is None:
            single = len(self.plan.fields) == 1
            values: dict[Key, Value] = {
                ((key,) if single else key): Count(n) for key, n in self.counts.items()
            }
            result.maps.insert(0, AggregateMap(self.name, self.plan.fields, values))
            return result
        self._fold()
        result.maps.insert(
            0,
            AggregateMap(
                self.name,
                self.plan.fields,
                {key: h.copy() for key, h in self.histograms.items()},
            ),
        )
        return result

    def clear(self) -> None:
        self.counts.clear()
        self.histograms.clear()
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
