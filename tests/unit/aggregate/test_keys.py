"""Key lists as users write them, and keys compiled from events."""

from __future__ import annotations

import pytest

from probescope.aggregate.aggregators import EventAggregator
from probescope.aggregate.keys import KeyPlan, parse_key_fields
from probescope.errors import SpecError
from probescope.events import EventBatch
from unit.aggregate.events_helper import event, event_type


def test_parse_key_fields() -> None:
    assert parse_key_fields("comm,pid") == ("comm", "pid")
    assert parse_key_fields(" probe , size") == ("probe", "size")


@pytest.mark.parametrize(
    ("text", "column"), [("comm,,pid", 5), ("comm,2x", 5), ("pid,comm,pid", 9)]
)
def test_bad_key_lists_point_at_the_name(text: str, column: int) -> None:
    with pytest.raises(SpecError) as error:
        parse_key_fields(text)
    assert error.value.column == column
    assert error.value.spec == text


def test_key_function_reads_fields_and_arguments() -> None:
    kind = event_type("malloc", ("size",))
    key = KeyPlan(("probe", "comm", "pid", "tid", "cpu", "size", "missing")).compile(kind)
    assert key(event(kind, 48, tid=11, pid=10, cpu=1)) == ("malloc", "prog", 10, 11, 1, 48, None)
    assert KeyPlan(("size",)).compile(kind)(event(kind, 7)) == (7,)
    assert KeyPlan(()).compile(kind)(event(kind, 7)) == ()


def test_event_aggregator_counts_and_intervals() -> None:
    kind = event_type("f", ("x",))
    aggregator = EventAggregator("@count", KeyPlan(("x",)))
    aggregator.add_batch(EventBatch([event(kind, 1), event(kind, 2), event(kind, 1)], lost=4))
    snapshot = aggregator.snapshot()
    assert snapshot.first.counts() == {(1,): 2, (2,): 1}
    assert snapshot.counters == {"lost events": 4}
    aggregator.clear()
    aggregator.add(event(kind, 2))
    assert aggregator.snapshot().first.counts() == {(2,): 1}


def test_kernel_stack_records_attach_to_the_event_before_them_on_their_cpu() -> None:
    import struct

    from probescope.aggregate.aggregators import StackOptions
    from probescope.aggregate.symbolize import Symbolizer
    from probescope.events import Event, EventType
    from probescope.language.model import ProbeKind

    class Kallsyms:
        def lookup(self, address: int) -> tuple[str, int, int, str | None]:
            return (f"k{address:x}", 0, 1, None)

    probe = event_type("t")
    record = EventType("ftrace", "kernel_stack", ProbeKind.FUNCTION, ("size", "caller"))
    stack = struct.pack("<3Q", 0xA, 0xB, (1 << 64) - 1)
    aggregator = EventAggregator(
        "@stacks",
        KeyPlan(("kstack",)),
        symbolizer=Symbolizer(kernel=Kallsyms()),
        stacks=StackOptions(kernel_stacks=True),
    )
    events = [
        event(probe, cpu=0),
        event(probe, cpu=1),
        Event(0, 0, 0, 0, "", record, 0, None, (2, stack)),
        Event(0, 1, 0, 0, "", record, 0, None, (2, struct.pack("<Q", 0xC))),
        event(probe, cpu=0),  # its record never comes: counted without a stack
    ]
    aggregator.add_batch(EventBatch(events))
    snapshot = aggregator.snapshot()
    counts = {tuple(f.function for f in key[0]): n for key, n in snapshot.first.counts().items()}
    assert counts == {("ka", "kb"): 1, ("kc",): 1, (): 1}
    assert snapshot.counters == {"events whose stack the kernel did not record": 1}
