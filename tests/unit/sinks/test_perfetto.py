"""The Perfetto output parses back with the perfetto package's protos into the tracks, nested
slices, instants and annotations the events describe."""

from __future__ import annotations

import io

import pytest

from probescope.events import Event, EventBatch, EventType
from probescope.language.model import ArgType, ProbeKind
from probescope.sinks.base import open_sink
from probescope.sinks.perfetto import entry_events_with_returns

pb2 = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

OUTER = EventType("u", "outer", ProbeKind.UPROBE, ("n",), (ArgType("s32", "s32", 4, True),))
OUTER_RET = EventType(
    "u", "outer__return", ProbeKind.URETPROBE, ("r",), (ArgType("u64", "u64", 8, False),)
)
INNER = EventType("u", "inner", ProbeKind.UPROBE, ("s",), (ArgType("string", "string", 4, False),))
INNER_RET = EventType("u", "inner__return", ProbeKind.URETPROBE)
LONE = EventType("u", "lone", ProbeKind.UPROBE)
TP = EventType(
    "sched", "sched_wakeup", ProbeKind.TRACEPOINT, ("pid",), (ArgType("int", "s32", 4, True),)
)
STACK = EventType(
    "ftrace", "user_stack", ProbeKind.FUNCTION, ("caller",), (ArgType("x", "bytes", 0, False),)
)


def event(
    ts: int, tid: int, event_type: EventType, ip: int, *args: object, ret_ip: int | None = None
) -> Event:
    return Event(ts, 0, 100, tid, f"t{tid}", event_type, ip=ip, ret_ip=ret_ip, args=args)


def trace_of(events: list[Event], **options: object) -> tuple[list[object], object]:
    out = io.BytesIO()
    sink = open_sink("perfetto", out, **options)
    sink.write_batch(EventBatch(events))
    sink.close()
    trace = pb2.Trace()
    trace.ParseFromString(out.getvalue())
    return list(trace.packet), sink


def test_entries_and_returns_nest_as_slices_with_their_durations() -> None:
    types = [OUTER, OUTER_RET, INNER, INNER_RET, LONE, TP]
    events = [
        event(1000, 101, OUTER, 0x10, 5),
        event(1100, 101, INNER, 0x20, "hi"),
        event(1150, 101, LONE, 0x30),
        event(1160, 102, TP, 0, 7),
        event(1200, 101, INNER_RET, 0x20, ret_ip=0x11),
        event(1300, 101, OUTER_RET, 0x10, 2**64 - 1, ret_ip=0x99),
        event(1400, 101, INNER_RET, 0x20, ret_ip=0x11),  # no open entry: dropped, counted
    ]
    packets, sink = trace_of(events, slices=entry_events_with_returns(types))
    threads = {
        p.track_descriptor.uuid: p.track_descriptor.thread
        for p in packets
        if p.track_descriptor.HasField("thread")
    }
    processes = {
        p.track_descriptor.process.pid: p.track_descriptor.process
        for p in packets
        if p.track_descriptor.HasField("process")
    }
    assert {t.tid for t in threads.values()} == {101, 102}
    assert {t.thread_name for t in threads.values()} == {"t101", "t102"}
    assert list(processes) == [100]
    tracked = [p for p in packets if p.HasField("track_event")]
    kinds = [(p.timestamp, p.track_event.type, p.track_event.name) for p in tracked]
    TE = pb2.TrackEvent
    assert kinds == [
        (1000, TE.TYPE_SLICE_BEGIN, "outer"),
        (1100, TE.TYPE_SLICE_BEGIN, "inner"),
        (1150, TE.TYPE_INSTANT, "lone"),
        (1160, TE.TYPE_INSTANT, "sched_wakeup"),
        (1200, TE.TYPE_SLICE_END, ""),
        (1300, TE.TYPE_SLICE_END, ""),
    ]
    # a slice's duration is its return's time minus its entry's, the inner one inside
    stack, durations = [], {}
    for ts, kind, name in kinds:
        if kind == TE.TYPE_SLICE_BEGIN:
            stack.append((name, ts))
        elif kind == TE.TYPE_SLICE_END:
            name, start = stack.pop()
            durations[name] = (start, ts - start, len(stack))
    assert durations == {"inner": (1100, 100, 1), "outer": (1000, 300, 0)}
    assert sink.unmatched_returns == 1  # type: ignore[attr-defined]
    annotations = {a.name: a for a in tracked[0].track_event.debug_annotations}
    assert annotations["n"].int_value == 5 and annotations["ip"].int_value == 0x10
    end = {a.name: a for a in tracked[5].track_event.debug_annotations}
    assert end["r"].uint_value == 2**64 - 1 and end["ret_ip"].int_value == 0x99
    assert {a.name: a.string_value for a in tracked[1].track_event.debug_annotations}["s"] == "hi"
    assert tracked[3].track_event.track_uuid != tracked[0].track_event.track_uuid


def test_a_return_that_skips_entries_ends_them_too() -> None:
    events = [
        event(10, 1, OUTER, 0x10, 1),
        event(20, 1, INNER, 0x20, "x"),
        event(30, 1, OUTER_RET, 0x10, 0, ret_ip=1),  # longjmp past inner
    ]
    packets, _ = trace_of(events, slices={"outer", "inner"})
    ends = [
        p.timestamp
        for p in packets
        if p.HasField("track_event") and p.track_event.type == pb2.TrackEvent.TYPE_SLICE_END
    ]
    assert ends == [30, 30]


def test_user_stacks_become_the_callstack_of_their_event() -> None:
    raw = (0x401234).to_bytes(8, "little") + (0x405000).to_bytes(8, "little") + bytes(8)
    events = [event(10, 1, LONE, 0x30), event(10, 1, STACK, 0, raw)]
    names = {0x401234: "main+0x4"}
    packets, _ = trace_of(events, symbolize=lambda pid, address, ts: names.get(address))
    (tracked,) = [p for p in packets if p.HasField("track_event")]
    assert [f.function_name for f in tracked.track_event.callstack.frames] == [
        "main+0x4",
        "0x405000",
    ]


def test_without_slice_names_returns_seen_so_far_pair() -> None:
    events = [
        event(1, 1, INNER, 0x20, "a"),
        event(2, 1, INNER_RET, 0x20, ret_ip=1),
        event(3, 1, INNER, 0x20, "b"),
        event(4, 1, INNER_RET, 0x20, ret_ip=1),
    ]
    packets, sink = trace_of(events)
    kinds = [p.track_event.type for p in packets if p.HasField("track_event")]
    TE = pb2.TrackEvent
    assert kinds == [TE.TYPE_INSTANT, TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END]
    assert sink.unmatched_returns == 1  # type: ignore[attr-defined]
