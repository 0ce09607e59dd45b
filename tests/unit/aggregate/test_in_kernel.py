"""What the aggregate layer asks an engine to compute in the kernel, and how the per-CPU
words it reads back become the same values the user-space aggregators give (no kernel)."""

from __future__ import annotations

from dataclasses import replace

from probescope.aggregate.in_kernel import KernelReader, kernel_request
from probescope.aggregate.latency import ABANDONED, OPEN
from probescope.aggregate.plan import Plan, Request
from probescope.aggregate.symbolize import Symbolizer
from probescope.aggregate.values import Count, Histogram, Latency, LinearScale
from probescope.engines.aggregation import KernelAggregation, KernelEntry, KernelValues
from probescope.language.arch import host_arch
from probescope.language.model import ProbeKind
from unit.aggregate.events_helper import event_type


def plan(request: Request, fields: tuple[str, ...]) -> Plan:
    return Plan(request, "bpf", host_arch(), fields=fields, in_kernel=True)


def test_requests_become_kernel_aggregations() -> None:
    counting = kernel_request(plan(Request("count", ("c:malloc",)), ("probe",)))
    assert counting == KernelAggregation("count", ("probe",), retval="__ps_retval")
    linear = Request("hist", ("c:malloc",), of="size", scale=LinearScale(0, 128, 32))
    assert kernel_request(plan(linear, ()), intervals=True) == KernelAggregation(
        "hist", (), of="size", linear=(0, 128, 32), retval="__ps_retval", intervals=True
    )
    timing = kernel_request(plan(Request("latency", ("c:malloc",), unit="ms"), ()))
    assert isinstance(timing, KernelAggregation) and timing.unit_ns == 1_000_000
    stacks = Request("stacks", ("c:malloc",), stack_method="fp")
    assert kernel_request(plan(stacks, ("ustack",))) == KernelAggregation(
        "count", ("ustack",), retval="__ps_retval"
    )


def test_requests_that_need_every_hit_in_user_space_say_why() -> None:
    dwarf = kernel_request(plan(Request("stacks", ("c:malloc",)), ("ustack",)))
    assert isinstance(dwarf, str) and "DWARF" in dwarf
    spans = Request("latency", ("c:malloc",), keep_spans=True)
    assert "evented profile" in str(kernel_request(plan(spans, ())))


class FakeEngine:
    def __init__(self, reads: list[KernelValues]) -> None:
        self.reads = reads
        self.asked: list[tuple[bool, bool]] = []

    def can_aggregate(self, aggregation: object, probes: object) -> str | None:
        return None

    def read_aggregation(self, *, clear: bool = False, final: bool = False) -> KernelValues:
        self.asked.append((clear, final))
        return self.reads.pop(0)


ALPHA = event_type("alpha")
SCHED = replace(event_type("sched_switch"), group="sched", kind=ProbeKind.TRACEPOINT)


def reader(request: Request, fields: tuple[str, ...], reads: list[KernelValues], **kw: bool):  # type: ignore[no-untyped-def]
    engine = FakeEngine(reads)
    return KernelReader("@m", plan(request, fields), engine, Symbolizer(), **kw), engine


def test_counts_are_summed_over_cpus_and_keys_named_like_events() -> None:
    read = KernelValues(
        entries=[
            KernelEntry(0, (0, 7), None, ((3,), (4,))),
            KernelEntry(1, (1, 7), None, ((0,), (2,))),
            KernelEntry(0, (0, None), None, ((0,), (0,))),  # nothing counted: no key
        ],
        event_types={0: ALPHA, 1: SCHED},
        counters={"map_full": 2},
    )
    count, engine = reader(Request("count", ("x",)), ("probe", "x"), [read], intervals=False)
    values = count.snapshot()
    assert values.first.key_names == ("probe", "x")
    assert values.first.values == {("alpha", 7): Count(7), ("sched:sched_switch", 7): Count(2)}
    assert values.counters == {"hits not counted: the kernel's map of keys was full": 2}
    assert engine.asked == [(False, False)]


def test_keys_that_meet_after_reading_merge() -> None:
    read = KernelValues(
        entries=[KernelEntry(0, (5,), 100, ((1,),)), KernelEntry(1, (5,), 101, ((2,),))],
        event_types={0: ALPHA, 1: ALPHA},
    )
    count, _ = reader(Request("count", ("x",)), ("x",), [read], intervals=False)
    assert count.snapshot().first.values == {(5,): Count(3)}


def test_histograms_merge_cpus_and_skip_those_that_counted_nothing() -> None:
    buckets = [0] * 6
    one = (*[0, 1, 0, 0, 0, 0], 1, 0, 0, 0)
    two = (*[0, 0, 2, 0, 0, 0], 2, 70, 33, 37)
    idle = (*buckets, 0, 0, None, None)
    read = KernelValues([KernelEntry(0, (), None, (one, two, idle))], {0: ALPHA})
    request = Request("hist", ("x",), of="x", scale=LinearScale(0, 128, 32))
    hist, _ = reader(request, (), [read], intervals=False)
    (value,) = hist.snapshot().first.values.values()
    assert value == Histogram(LinearScale(0, 128, 32), {1: 1, 2: 2}, 3, 70, 0, 37)


def test_latency_keeps_nanoseconds_and_buckets_in_its_unit() -> None:
    words = [0] * 66
    words[12] = 2  # [1024, 2048) us
    read = KernelValues(
        [KernelEntry(0, (), None, ((*words, 2, 3_000_000, 1_200_000, 1_800_000),))],
        {0: ALPHA},
        {"abandoned": 1, "open": 2},
    )
    latency, _ = reader(Request("latency", ("f",), unit="us"), (), [read], intervals=False)
    result = latency.snapshot(final=True)
    (value,) = result.first.values.values()
    assert isinstance(value, Latency)
    assert (value.count, value.total_ns, value.min_ns, value.max_ns) == (
        2,
        3_000_000,
        1_200_000,
        1_800_000,
    )
    assert value.histogram.buckets == {12: 2}
    assert (value.histogram.min, value.histogram.max) == (1200, 1800)
    assert result.counters == {ABANDONED: 1, OPEN: 2}


def test_intervals_drain_the_kernel_and_keep_values_until_cleared() -> None:
    first = KernelValues([KernelEntry(0, (0,), None, ((2,),))], {0: ALPHA})
    second = KernelValues([KernelEntry(0, (0,), None, ((3,),))], {0: ALPHA})
    count, engine = reader(Request("count", ("f",)), ("probe",), [first, second], intervals=True)
    assert count.snapshot().first.values == {("alpha",): Count(2)}
    assert count.snapshot(final=True).first.values == {("alpha",): Count(5)}
    count.clear()
    assert engine.asked == [(True, False), (True, True)]
