"""Latency: recursion pairs every call, longjmp'd calls are dropped and counted, sleeps measure
as slept — from both engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.aggregate.conftest import ENGINES
from probescope.aggregate.latency import ABANDONED, OPEN, UNMATCHED
from probescope.aggregate.values import Latency
from probescope.aggregations import latency

pytestmark = pytest.mark.root


def only_value(result: object) -> Latency:
    ((_, value),) = result.first.items()  # type: ignore[attr-defined]
    assert isinstance(value, Latency)
    return value


@pytest.mark.parametrize("engine", ENGINES)
def test_recursion_gives_one_sample_per_call(engine: str, workload: Path) -> None:
    result = latency([f"{workload}:fib"], command=[str(workload), "fib"], engine=engine)
    value = only_value(result)
    assert value.count == 1973  # calls of fib(15)
    assert value.histogram.count == 1973
    assert UNMATCHED not in result.counters and ABANDONED not in result.counters


@pytest.mark.parametrize("engine", ENGINES)
def test_longjmp_abandons_calls(engine: str, workload: Path) -> None:
    result = latency([f"{workload}:jumper"], command=[str(workload), "jump"], engine=engine)
    assert result.first.counts() == {}
    # 3 rounds of 4 nested calls: the next round's first call ends the previous round's
    # four; the last round's deeper three end at no later call, so they stay open.
    assert result.counters.get(ABANDONED, 0) + result.counters.get(OPEN, 0) == 12
    assert result.counters.get(ABANDONED) == 8
    assert UNMATCHED not in result.counters


@pytest.mark.parametrize("engine", ENGINES)
def test_sleeps_measure_as_slept(engine: str, workload: Path) -> None:
    result = latency([f"{workload}:nap"], unit="ms", command=[str(workload), "nap"], engine=engine)
    value = only_value(result)
    assert value.count == 5
    assert value.min_ns is not None and value.max_ns is not None
    assert value.min_ns >= 20_000_000
    assert value.max_ns < 200_000_000  # 20 ms asked; a busy machine may add some
    assert set(value.histogram.buckets) <= {6, 7}  # [16, 32) ms, [32, 64) when late
