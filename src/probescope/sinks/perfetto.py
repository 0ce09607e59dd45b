"""A native Perfetto trace (TrackEvent protobuf), written with the `perfetto` package's protos
and its streaming builder: what the Perfetto UI and trace_processor open.

A track per process and per thread, named by their comms. A function's entry and return
events become one slice (TYPE_SLICE_BEGIN at the entry, TYPE_SLICE_END at the return on the
same thread at the same function address; calls nest): `slices` names the entry events that
have a return probe (for a recording or session, `pairing.entry_events_with_returns`); a
return with no open entry is dropped and counted (`unmatched_returns`); a return that skips
open entries (longjmp, exceptions) ends them too. Every other event — uprobes without a
return, USDT probes, kernel tracepoints, function-tracer records — is an instant on its
thread's track, on the same timeline. Arguments (and `ip`, `ret_ip`) are debug annotations. A
`user_stack` record (the kernel's userstacktrace, `--stack`) becomes the callstack of the
event it follows, its frames named by `symbolize(pid, address, timestamp)` when given.
Timestamps are the trace clock's nanoseconds, written as the packets' own clock.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection
from typing import IO, Any

from probescope.errors import ProbescopeError
from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ProbeKind
from probescope.sinks.base import OutputFormat
from probescope.traceevent.context import KernelContext

SEQUENCE_ID = 1
SEQ_INCREMENTAL_STATE_CLEARED = 1
Symbolizer = Callable[[int, int, int], str | None]
"""`symbolize(pid, address, timestamp_ns)`: the function an address of process `pid` was in."""


def _protos() -> Any:
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
    except ImportError:
        raise ProbescopeError(
            "the perfetto output needs the perfetto package",
            hint="pip install 'probescope[perfetto]' (or pip install perfetto)",
        ) from None
    return perfetto_trace_pb2, StreamingTraceProtoBuilder


class PerfettoSink:
    """Writes a Perfetto trace to a binary `stream` (see the module's docstring)."""

    def __init__(
        self,
        stream: IO[bytes],
        *,
        context: KernelContext | None = None,
        slices: Collection[str] | None = None,
        symbolize: Symbolizer | None = None,
    ) -> None:
        protos, builder = _protos()
        self._protos = protos
        self._builder = builder(stream)
        self.stream = stream
        self.context = context or KernelContext()
        self.slices = set(slices) if slices is not None else None
        self.symbolize = symbolize
        self.unmatched_returns = 0
        self.open_slices: dict[int, list[tuple[int, str]]] = {}
        self._return_addresses: set[int] = set()
        self._processes: dict[int, int] = {}
        self._threads: dict[int, int] = {}
        self._next_uuid = 1
        self._pending: tuple[Any, Event] | None = None
        self._first = True
        self.packets = 0

    # -- tracks -----------------------------------------------------------------------------

    def _uuid(self) -> int:
        self._next_uuid += 1
        return self._next_uuid

    def _thread_track(self, event: Event) -> int:
        track = self._threads.get(event.tid)
        if track is not None:
            return track
        pid = event.pid
        if pid not in self._processes:
            uuid = self._processes[pid] = self._uuid()
            packet = self._packet()
            packet.track_descriptor.uuid = uuid
            packet.track_descriptor.process.pid = pid
            packet.track_descriptor.process.process_name = (
                event.comm if event.tid == pid else f"pid {pid}"
            )
            self._write(packet)
        uuid = self._threads[event.tid] = self._uuid()
        packet = self._packet()
        descriptor = packet.track_descriptor
        descriptor.uuid = uuid
        descriptor.parent_uuid = self._processes[pid]
        descriptor.thread.pid = pid
        descriptor.thread.tid = event.tid
        descriptor.thread.thread_name = event.comm
        self._write(packet)
        return uuid

    # -- events -----------------------------------------------------------------------------

    def _packet(self) -> Any:
        packet = self._builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if self._first:
            packet.sequence_flags = SEQ_INCREMENTAL_STATE_CLEARED
            self._first = False
        return packet

    def _write(self, packet: Any) -> None:
        self._builder.write_packet(packet)
        self.packets += 1

    def write(self, event: Event) -> None:
        self.write_batch(EventBatch([event]))

    def write_batch(self, batch: EventBatch) -> None:
        for event in batch.events:
            event_type = event.type
            if event_type.kind is ProbeKind.FUNCTION and event_type.name == "user_stack":
                self._attach_stack(event)
                continue
            self._flush_pending()
            track = self._thread_track(event)
            packet = self._packet()
            packet.timestamp = event.timestamp_ns
            track_event = packet.track_event
            track_event.track_uuid = track
            track_event.categories.append(str(event_type.kind))
            kind = event_type.kind
            if kind.is_return:
                if not self._end_slice(event, track_event):
                    continue
            elif kind in (ProbeKind.UPROBE, ProbeKind.USDT) and self._opens_slice(event):
                track_event.type = track_event.TYPE_SLICE_BEGIN
                track_event.name = event_type.name
                self.open_slices.setdefault(event.tid, []).append((event.ip, event_type.name))
            else:
                track_event.type = track_event.TYPE_INSTANT
                track_event.name = event_type.name
            self._annotate(track_event, event)
            self._pending = (packet, event)

    def _opens_slice(self, event: Event) -> bool:
        if self.slices is not None:
            return event.type.name in self.slices
        return event.ip in self._return_addresses

    def _end_slice(self, event: Event, track_event: Any) -> bool:
        """Close the slice this return ends (and any it skipped); False when none is open."""
        self._return_addresses.add(event.ip)
        stack = self.open_slices.get(event.tid, [])
        depth = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == event.ip), None)
        if depth is None:
            self.unmatched_returns += 1
            return False
        for _ in range(len(stack) - depth - 1):
            stack.pop()
            skipped = self._packet()
            skipped.timestamp = event.timestamp_ns
            skipped.track_event.track_uuid = track_event.track_uuid
            skipped.track_event.type = track_event.TYPE_SLICE_END
            self._write(skipped)
        stack.pop()
        track_event.type = track_event.TYPE_SLICE_END
        return True

    def _annotate(self, track_event: Any, event: Event) -> None:
        annotations = track_event.debug_annotations
        if event.ip:
            _set(annotations.add(), "ip", event.ip)
        if event.ret_ip is not None:
            _set(annotations.add(), "ret_ip", event.ret_ip)
        for index, name, _ in event.type.shown_arguments():
            _set(annotations.add(), name, event.args[index])

    def _attach_stack(self, stack_event: Event) -> None:
        pending = self._pending
        if pending is None or pending[1].tid != stack_event.tid:
            return
        packet, event = pending
        raw = stack_event.args[-1] if stack_event.args else b""
        if not isinstance(raw, bytes | bytearray):
            return
        frames = packet.track_event.callstack.frames
        for (address,) in struct.iter_unpack("<Q", raw[: len(raw) // 8 * 8]):
            if not address:
                break
            name = None
            if self.symbolize is not None:
                name = self.symbolize(event.pid, address, event.timestamp_ns)
            frames.add().function_name = name or f"0x{address:x}"

    def _flush_pending(self) -> None:
        if self._pending is not None:
            self._write(self._pending[0])
            self._pending = None

    def flush(self) -> None:
        self._flush_pending()
        self.stream.flush()

    def close(self) -> None:
        self.flush()


def _set(annotation: Any, name: str, value: Any) -> None:
    annotation.name = name
    if isinstance(value, bool):
        annotation.bool_value = value
    elif isinstance(value, int):
        if value > (1 << 63) - 1:
            annotation.uint_value = value
        else:
            annotation.int_value = value
    elif isinstance(value, str):
        annotation.string_value = value
    elif value is None:
        annotation.string_value = "(fault)"
    elif isinstance(value, bytes | bytearray):
        annotation.string_value = bytes(value).hex()
    elif isinstance(value, tuple | list):
        for item in value:
            _set(annotation.array_values.add(), "", item)
    else:
        annotation.string_value = str(value)


def entry_events_with_returns(
    event_types: Collection[EventType],
    probes: Collection[tuple[str, ProbeKind, str | None, int | None]] = (),
) -> set[str]:
    """Entry events that a return event of the same function ends: a return probe at the same
    place (`probes`: event name, kind, path, offset), or probescope's and perf's naming
    (`NAME` and `NAME__return`) among `event_types`."""
    returns = {(path, offset) for _, kind, path, offset in probes if kind.is_return}
    paired = {
        name
        for name, kind, path, offset in probes
        if not kind.is_return and path is not None and (path, offset) in returns
    }
    names = {t.name for t in event_types if t.kind.is_return}
    paired |= {
        t.name
        for t in event_types
        if t.kind in (ProbeKind.UPROBE, ProbeKind.USDT) and f"{t.name}__return" in names
    }
    return paired


PERFETTO_FORMAT = OutputFormat(
    name="perfetto",
    description="a Perfetto trace (TrackEvent protobuf): slices, instants, callstacks",
    factory=PerfettoSink,
    binary=True,
)
