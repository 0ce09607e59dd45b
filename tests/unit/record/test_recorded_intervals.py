"""Intervals of recorded time (`recorded_intervals`) and frames named from a recording's facts
alone (`RecordedFrames`), on hand-made events and facts."""

from __future__ import annotations

from probescope.events import EventBatch, EventType
from probescope.language.model import ProbeKind
from probescope.record.facts import MappedFile, ProcessMaps, RecordingFacts
from probescope.record.recording_aggregation import recorded_intervals
from probescope.record.symbolizer import RecordedFrames
from unit.aggregate.events_helper import event, event_type

MS = 1_000_000
HIT = event_type("hit")
USER_STACK = EventType("ftrace", "user_stack", ProbeKind.FUNCTION, ("caller",), ())


def cut(batches: list[EventBatch], step: int) -> list[object]:
    """Each interval end as ('end', start, end), each batch as its events' timestamps."""
    shown: list[object] = []
    for item in recorded_intervals(batches, step):
        if isinstance(item, EventBatch):
            shown.append([e.timestamp_ns for e in item.events])
        else:
            shown.append(("end", *item))
    return shown


def test_the_first_event_starts_the_first_interval() -> None:
    batch = EventBatch([event(HIT, ts=t) for t in (1000, 1001, 1000 + 10 * MS, 1000 + 25 * MS)])
    assert cut([batch], 10 * MS) == [
        [1000, 1001],
        ("end", 1000, 1000 + 10 * MS),
        [1000 + 10 * MS],
        ("end", 1000 + 10 * MS, 1000 + 20 * MS),
        [1000 + 25 * MS],
    ]


def test_empty_intervals_are_ended_too() -> None:
    batches = [EventBatch([event(HIT, ts=0)]), EventBatch([event(HIT, ts=35 * MS)])]
    assert cut(batches, 10 * MS) == [
        [0],
        ("end", 0, 10 * MS),
        ("end", 10 * MS, 20 * MS),
        ("end", 20 * MS, 30 * MS),
        [35 * MS],
    ]


def test_a_stack_record_stays_with_its_event() -> None:
    events = [
        event(HIT, ts=0),
        event(HIT, ts=9 * MS),
        event(USER_STACK, b"", ts=10 * MS),  # written after the hit, past the interval's end
        event(HIT, ts=11 * MS),
    ]
    assert cut([EventBatch(events)], 10 * MS) == [
        [0, 9 * MS, 10 * MS],
        ("end", 0, 10 * MS),
        [11 * MS],
    ]


def test_lost_events_stay_with_the_batch_they_came_before() -> None:
    batch = EventBatch([event(HIT, ts=0), event(HIT, ts=20 * MS)], 7)
    items = list(recorded_intervals([batch], 10 * MS))
    assert isinstance(items[0], EventBatch) and items[0].lost == 7
    assert isinstance(items[-1], EventBatch) and items[-1].lost == 0


FACTS = RecordingFacts(
    processes=[
        ProcessMaps(10, 0, "prog", ((0x1000, 0x2000, 0x1000, "/bin/prog"),)),
        ProcessMaps(
            10,
            5,
            "prog",
            ((0x1000, 0x2000, 0x1000, "/bin/prog"), (0x7000, 0x8000, 0, "/lib/libx.so")),
        ),
    ],
    files=[MappedFile("/bin/prog", "ab", ((0x1000, 0x40, "main"), (0x1040, 0x10, "leaf")))],
)


def test_recorded_frames_name_addresses_as_a_live_symbolizer() -> None:
    frames = RecordedFrames(FACTS)
    stack = frames.user_stack(10, [0x1040, 0x1013, 0x7010, 0x9000])
    assert [(f.function, f.offset, f.module) for f in stack] == [
        ("leaf", 0, "/bin/prog"),  # the probed pc itself
        ("main", 0x13, "/bin/prog"),  # a return address, looked up at its call
        ("0x10", 0, "/lib/libx.so"),  # a file whose functions were not recorded
        ("0x9000", 0, "[unknown]"),  # no mapping
    ]
    assert frames.unresolved == 2
