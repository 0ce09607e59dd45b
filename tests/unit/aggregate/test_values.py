"""The value model: bpftrace's bucket numbering, merging, and values built from in-kernel
counters."""

from __future__ import annotations

import pytest

from probescope.aggregate.maps import AggregateMap, Aggregation
from probescope.aggregate.values import (
    LOG2,
    AggregateError,
    Count,
    Frame,
    Histogram,
    Latency,
    LinearScale,
    Stacks,
    merge_values,
)


@pytest.mark.parametrize(
    ("value", "index"),
    [(-1, 0), (-(1 << 40), 0), (0, 1), (1, 2), (2, 3), (3, 3), (4, 4), (1023, 11), (1024, 12)],
)
def test_log2_index_is_bpftraces(value: int, index: int) -> None:
    assert LOG2.index(value) == index
    low, high = LOG2.bounds(index)
    assert (low is None or low <= value) and (high is None or value <= high)


def test_log2_bounds() -> None:
    assert LOG2.bounds(0) == (None, -1)
    assert LOG2.bounds(1) == (0, 0)
    assert LOG2.bounds(2) == (1, 1)
    assert LOG2.bounds(12) == (1024, 2047)


def test_linear_scale() -> None:
    scale = LinearScale(100, 300, 100)
    assert scale.buckets == 2
    assert [scale.index(v) for v in (99, 100, 199, 200, 299, 300, 10**9)] == [0, 1, 1, 2, 2, 3, 3]
    assert scale.bounds(0) == (None, 99)
    assert scale.bounds(1) == (100, 199)
    assert scale.bounds(3) == (300, None)


@pytest.mark.parametrize(("low", "high", "step"), [(0, 100, 0), (10, 10, 1), (0, 10, 3)])
def test_bad_linear_scales(low: int, high: int, step: int) -> None:
    with pytest.raises(AggregateError):
        LinearScale(low, high, step)


def test_histogram_add_and_merge() -> None:
    first, second = Histogram(), Histogram()
    for value in (0, 1, 2, 3, 100):
        first.add(value)
    second.add(-7, times=3)
    merged = first.copy().merge(second)
    assert merged.buckets == {0: 3, 1: 1, 2: 1, 3: 2, 8: 1}
    assert (merged.count, merged.total, merged.min, merged.max) == (8, 106 - 21, -7, 100)
    assert first.count == 5  # the copy was merged, not the original
    assert merged.rows()[0] == (0, 3) and len(merged.rows()) == 9


def test_histograms_of_different_scales_do_not_merge() -> None:
    with pytest.raises(AggregateError):
        Histogram().merge(Histogram(LinearScale(0, 10, 1)))


def test_values_from_in_kernel_counters() -> None:
    assert Count.from_per_cpu([3, 0, 4]).value == 7
    histogram = Histogram.from_buckets([0, 2, 0, 5])
    assert histogram.buckets == {1: 2, 3: 5} and histogram.count == 7
    latency = Latency.from_parts({11: 4}, unit="us", count=4, total_ns=4_400_000)
    assert latency.histogram.buckets == {11: 4}
    assert latency.average_ns == 1_100_000


def test_latency_units_and_merge() -> None:
    a, b = Latency("us"), Latency("us")
    a.add(1_500)  # 1 us
    b.add(20_000_000)  # 20000 us
    a.merge(b)
    assert a.count == 2 and a.min_ns == 1_500 and a.max_ns == 20_000_000
    assert a.histogram.buckets == {2: 1, 16: 1}
    with pytest.raises(AggregateError):
        a.merge(Latency("ms"))
    with pytest.raises(AggregateError):
        Latency("hours")


def test_stacks_merge_and_kinds() -> None:
    stack = (Frame("leaf", 0, "/bin/x"), Frame("main", 12, "/bin/x"))
    a = Stacks()
    a.add(stack, 2)
    b = Stacks()
    b.add(stack)
    assert a.merge(b).weights == {stack: 3}
    with pytest.raises(AggregateError):
        merge_values(Count(1), a)


def test_maps_and_aggregations_merge_per_key() -> None:
    one = AggregateMap("@count", ("probe",), {("a",): Count(1)})
    two = AggregateMap("@count", ("probe",), {("a",): Count(2), ("b",): Count(5)})
    first = Aggregation([one], {"lost events": 1})
    first.merge(Aggregation([two], {"lost events": 2}))
    assert first.first.counts() == {("a",): 3, ("b",): 5}
    assert first.counters == {"lost events": 3}
    assert two.counts() == {("a",): 2, ("b",): 5}  # merged copies, the source is untouched
    assert one.top(1).counts() == {("b",): 5}
    with pytest.raises(AggregateError):
        one.merge(AggregateMap("@count", ("comm",)))


def test_map_as_stacks_puts_other_key_parts_at_the_root() -> None:
    user = (Frame("leaf", 0, "/bin/x"), Frame("main", 4, "/bin/x"))
    kernel = (Frame("schedule", 9, "[kernel]"),)
    found = AggregateMap(
        "@stacks", ("probe", "kstack", "ustack"), {("leaf", kernel, user): Count(3)}
    ).stacks()
    ((stack, weight),) = found.weights.items()
    assert weight == 3
    assert [f.function for f in stack] == ["schedule", "leaf", "main", "leaf"]
    assert stack[-1].module == "[key:probe]"
